"""py-iscsi: a Berth storage driver in Python, written from the WIT contract alone
(wit/driver@0.3.0, and the world `tgt-storage-driver` of wit/iscsi-chap@0.1.0), built into a
component with componentize-py. It does what the Rust tgt-iscsi driver does: a volume is a sparse
backing store exported through the host's iSCSI target service, one target per volume, LUN 1,
incoming CHAP with an account per initiator (made and kept by the host), one ACL entry per
initiator; a detach ends the initiator's sessions (it promises `terminate-ends-sessions`).

How the contract looks from Python (componentize-py conventions):
- the export `driver` is a class named `Driver` in this module, with one method per WIT function
  (snake_case); records are dataclasses with snake_case fields; a variant case is its own class
  (`DriverError_NotFound("...")`); enums are `Enum`s; `option<T>` is the value or `None`;
- a `result` is returned on success and raised on error: `raise Err(DriverError_NotFound(...))`.
  Imported functions raise `Err(...)` the same way, with the error case in `.value`.

Stateless: everything it knows comes from the volume record; what it learns goes back in the
model update (provider_location, and a driver-data key per connected initiator).
"""

import re
from typing import List, Optional

from componentize_py_types import Err
from wit_world import exports
from wit_world.exports.driver import Guarantee
from wit_world.imports import backing_store as stores
from wit_world.imports import config, initiator_accounts as accounts, iscsi_target as iscsi
from wit_world.imports.log import Level, log
from wit_world.imports.types import (
    Attachment,
    Capabilities,
    Connection,
    ConnectionInfo,
    Connector,
    DriverError_Backend,
    DriverError_Incompatible,
    DriverError_InvalidConnector,
    DriverError_NotFound,
    DriverError_Retryable,
    DriverInfo,
    InvalidConnector,
    ModelUpdate,
    Protocol_Iscsi,
    Termination,
    Value_Boolean,
    Value_Integer,
    Value_IntegerList,
    Value_Text,
    Value_TextList,
    Volume,
    VolumeField,
)

DEFAULT_PREFIX = "iqn.2010-10.org.openstack:"

# ---- errors -------------------------------------------------------------------------------


def target_error(what: str, e: Err) -> Err:
    case = e.value
    if isinstance(case, iscsi.TargetError_NotFound):
        return Err(DriverError_NotFound(f"{what}: {case.value}"))
    if isinstance(case, iscsi.TargetError_Timeout):
        return Err(DriverError_Retryable(f"{what}: {case.value}"))
    return Err(DriverError_Backend(f"{what}: {type(case).__name__}: {case.value}"))


def store_error(what: str, e: Err) -> Err:
    case = e.value
    if isinstance(case, stores.StoreError_NotFound):
        return Err(DriverError_NotFound(f"{what}: {case.value}"))
    if isinstance(case, stores.StoreError_Conflict):
        return Err(DriverError_Incompatible(f"{what}: {case.value}"))
    if isinstance(case, stores.StoreError_NoSpace):
        return Err(DriverError_Retryable(f"{what}: {case.value}"))
    return Err(DriverError_Backend(f"{what}: {type(case).__name__}: {case.value}"))


def attempt(what: str, wrap, f, *args):
    """Calls an imported function, turning what it raises into the driver's error."""
    try:
        return f(*args)
    except Err as e:
        raise wrap(what, e) from None


def invalid_connector(missing: List[str], reason: str) -> Err:
    return Err(DriverError_InvalidConnector(InvalidConnector(missing=missing, reason=reason)))


# ---- names --------------------------------------------------------------------------------

# Compiled at import: componentize-py snapshots the module after it is imported, so every fresh
# instance starts with these (a pattern compiled in a call is compiled again in every instance).
IQN = re.compile(r"^iqn\.(\d{4})-(\d{2})\.([^:]+)(?::(.*))?$")
ISCSI_CHARS = re.compile(r"[a-z0-9.:-]+")
EUI = re.compile(r"eui\.[0-9a-f]{16}")
NAA = re.compile(r"naa\.([0-9a-f]{16}|[0-9a-f]{32})")


def is_iscsi_name(name: Optional[str]) -> bool:
    """RFC 3720 iSCSI names, as the host checks them: lower-case iqn./eui./naa. forms, <= 223 bytes."""
    if not name or len(name.encode()) > 223 or not ISCSI_CHARS.fullmatch(name):
        return False
    if name.startswith("eui."):
        return EUI.fullmatch(name) is not None
    if name.startswith("naa."):
        return NAA.fullmatch(name) is not None
    m = IQN.match(name)
    if not m or not 1 <= int(m.group(2)) <= 12:
        return False
    if any(not label or label[0] == "-" or label[-1] == "-" for label in m.group(3).split(".")):
        return False
    return m.group(4) is None or len(m.group(4)) > 0


def initiator_of(connector: Connector) -> str:
    if connector.initiator is None:
        raise invalid_connector(["initiator"], "Connector doesn't have required information: initiator")
    if not is_iscsi_name(connector.initiator):
        raise invalid_connector([], "initiator: not a valid iSCSI name")
    return connector.initiator


def same_initiator(a: Connector, b: Connector) -> bool:
    return a.initiator is not None and a.initiator == b.initiator


# ---- the volume record --------------------------------------------------------------------


def target_iqn(volume: Volume) -> str:
    return (config.get("target_prefix") or DEFAULT_PREFIX) + volume.name


def lun() -> int:
    return int(config.get("target_lun") or "1")


def mode_key(initiator: str) -> str:
    return f"mode.{initiator}"


def data(volume: Volume, key: str) -> Optional[str]:
    return next((v for k, v in volume.driver_data if k == key), None)


def mode_keys(volume: Volume) -> List[str]:
    return [k for k, _ in volume.driver_data if k.startswith("mode.")]


def location(volume: Volume):
    """`<portal>[;<portal>...],<tid> <iqn> <lun>`, Cinder's provider_location."""
    not_exported = Err(DriverError_NotFound(f"volume {volume.id} is not exported"))
    text = volume.provider_location or ""
    if "," not in text:
        raise not_exported
    portals, rest = text.split(",", 1)
    words = rest.split()
    if len(words) < 2:
        raise not_exported
    return portals.split(";"), words[1], int(words[2]) if len(words) > 2 else 1


def portal_text(p: iscsi.Portal) -> str:
    return f"[{p.address}]:{p.port}" if ":" in p.address else f"{p.address}:{p.port}"


def update(location=None, auth=None, set_data=(), remove_data=(), clear=()) -> ModelUpdate:
    return ModelUpdate(
        provider_location=location,
        provider_auth=auth,
        provider_id=None,
        clear=list(clear),
        set_data=list(set_data),
        remove_data=list(remove_data),
    )


# ---- the contract -------------------------------------------------------------------------


class Driver(exports.Driver):
    def info(self) -> DriverInfo:
        return DriverInfo(
            name="py-iscsi",
            version="0.3.0",
            vendor="Berth",
            description="A Python driver: sparse backing stores exported over iSCSI with CHAP and per-initiator ACLs",
            protocols=[Protocol_Iscsi()],
            capabilities=Capabilities(multiattach=True, shared_targets=False),
        )

    def guarantees(self) -> List[Guarantee]:
        return [Guarantee.TERMINATE_ENDS_SESSIONS]

    def validate_connector(self, connector: Connector) -> None:
        initiator_of(connector)

    def create_volume(self, volume: Volume) -> ModelUpdate:
        attempt("create backing store", store_error, stores.create, volume.name, volume.size_gib << 30)
        return update()

    def extend_volume(self, volume: Volume, new_size_gib: int) -> ModelUpdate:
        # Grows the backing store (sparse: nothing is written). The host opens an attached
        # volume's LUN again as its store grows, so its hosts see the new size at once.
        attempt("grow backing store", store_error, stores.resize, volume.name, new_size_gib << 30)
        return update()

    def delete_volume(self, volume: Volume) -> None:
        attempt("delete target", target_error, iscsi.delete_target, target_iqn(volume))
        attempt("delete backing store", store_error, stores.delete, volume.name)

    def create_export(self, volume: Volume, connector: Optional[Connector]) -> ModelUpdate:
        # Each initiator's account is bound at its initialize-connection, before its ACL entry:
        # until then the target admits nobody.
        iqn = target_iqn(volume)
        unit = lun()
        target = attempt("show target", target_error, iscsi.show_target, iqn)
        if target is None:
            target = attempt("create target", target_error, iscsi.create_target, iqn)
        if unit not in target.luns:
            attempt("add LUN", target_error, iscsi.add_lun, iqn, unit, volume.name)
        portals = [portal_text(p) for p in iscsi.portals()]
        if not portals:
            raise Err(DriverError_Backend("the host has no iSCSI portal configured"))
        log(Level.DEBUG, f"exported {volume.id} as {iqn} (tid {target.tid})")
        return update(
            location=f"{';'.join(portals)},{target.tid} {iqn} {unit}",
            # Credentials of an account per export, from a build of this driver before 0.3.0.
            clear=[VolumeField.PROVIDER_AUTH] if volume.provider_auth is not None else [],
        )

    def remove_export(self, volume: Volume) -> ModelUpdate:
        attempt("delete target", target_error, iscsi.delete_target, target_iqn(volume))
        return update(remove_data=mode_keys(volume), clear=[VolumeField.PROVIDER_AUTH])

    def initialize_connection(self, volume: Volume, connector: Connector) -> Connection:
        initiator = initiator_of(connector)
        portals, iqn, unit = location(volume)
        mode = "rw" if connector.mode.name == "RW" else "ro"
        previous = data(volume, mode_key(initiator))
        if previous is not None and previous != mode:
            raise Err(
                DriverError_Incompatible(
                    f"initiator {initiator} is already connected {previous}; it cannot get {mode} access as well"
                )
            )
        # The initiator's own account is bound before its ACL entry exists, so that the target
        # never admits it without CHAP.
        credentials = attempt("grant CHAP account", target_error, accounts.grant, iqn, initiator)
        attempt("allow initiator", target_error, iscsi.allow_initiator, iqn, initiator)
        info = [
            ("target_discovered", Value_Boolean(False)),
            ("target_portal", Value_Text(portals[0])),
            ("target_iqn", Value_Text(iqn)),
            ("target_lun", Value_Integer(unit)),
            ("volume_id", Value_Text(volume.id)),
            ("auth_method", Value_Text("CHAP")),
            ("auth_username", Value_Text(credentials.username)),
            ("auth_password", Value_Text(credentials.secret)),
            ("access_mode", Value_Text(mode)),
            ("encrypted", Value_Boolean(False)),
        ]
        if len(portals) > 1 or connector.multipath:
            info.append(("target_portals", Value_TextList(portals)))
            info.append(("target_iqns", Value_TextList([iqn] * len(portals))))
            info.append(("target_luns", Value_IntegerList([unit] * len(portals))))
        return Connection(
            info=ConnectionInfo(driver_volume_type="iscsi", data=info),
            update=update(set_data=[(mode_key(initiator), mode)]),
        )

    def terminate_connection(
        self, volume: Volume, connector: Optional[Connector], others: List[Attachment]
    ) -> Termination:
        iqn = target_iqn(volume)
        revoke: List[str] = []
        if connector is None:
            # Force detach: everyone goes, whether in the ACL or still logged in.
            target = attempt("show target", target_error, iscsi.show_target, iqn)
            if target is not None:
                sessions = attempt("list sessions", target_error, iscsi.list_sessions, iqn)
                logged_in = [s.initiator for s in sessions if is_iscsi_name(s.initiator)]
                revoke = sorted(set(target.initiators) | set(logged_in))
        elif is_iscsi_name(connector.initiator):
            # Another live attachment from the same initiator still needs the ACL entry.
            needed = any(a.connector is not None and same_initiator(a.connector, connector) for a in others)
            if not needed:
                revoke = [connector.initiator]
        for initiator in revoke:
            attempt("deny initiator", target_error, iscsi.deny_initiator, iqn, initiator)
            # The target checks its ACL only at login: end the sessions already open.
            attempt("close sessions", target_error, iscsi.close_sessions, iqn, initiator)
            # Its own account goes last: the target keeps requiring CHAP of those still admitted.
            attempt("revoke CHAP account", target_error, accounts.revoke, iqn, initiator)
        if connector is None:
            attempt("revoke CHAP accounts", target_error, accounts.revoke_all, iqn)
        remove = mode_keys(volume) if connector is None else [mode_key(i) for i in revoke]
        in_use = connector is not None and any(a.connector is not None for a in others)
        return Termination(export_in_use=in_use, update=update(remove_data=remove))

    def shared_connections(self, volume: Volume, connector: Connector, attachments: List[Attachment]) -> List[str]:
        return [a.id for a in attachments if a.connector is not None and same_initiator(a.connector, connector)]


# ---- warm-up ------------------------------------------------------------------------------

# componentize-py runs this module once, when the component is built, and ships the interpreter
# as it stands afterwards. CPython specializes what it runs often (its adaptive interpreter), so
# the pure paths of every operation run here a few times with made-up values, and every instance
# starts with them specialized. No import is called (none is there while the component is built).
def _warm_up() -> None:
    initiator = "iqn.1993-08.org.debian:01:warm-up"
    for _ in range(16):
        for name in (initiator, "eui.0123456789abcdef", "naa.0123456789abcdef", "not a name", None):
            is_iscsi_name(name)
        mode_key(initiator)
        update(location="127.0.0.1:3260,1 iqn.2010-10.org.openstack:warm-up 1", set_data=[(mode_key(initiator), "rw")])


_warm_up()
