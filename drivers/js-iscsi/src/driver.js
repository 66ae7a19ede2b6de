// js-iscsi: a Berth storage driver in JavaScript, written from the WIT contract alone
// (wit/driver@0.3.0, and the world `tgt-storage-driver` of wit/iscsi-chap@0.1.0), built into a
// component with ComponentizeJS. It does what the Rust tgt-iscsi driver does: a volume is a
// sparse backing store exported through the host's iSCSI target service, one target per volume,
// LUN 1, incoming CHAP with an account per initiator (made and kept by the host), one ACL entry
// per initiator; a detach ends the initiator's sessions (it promises `terminate-ends-sessions`).
//
// How the contract looks from JavaScript (ComponentizeJS / jco conventions):
// - the export `driver` is an object with one function per WIT function, names in camelCase;
// - records are objects with camelCase fields; variants are `{ tag, val }`; enums are strings;
//   `option<T>` is the value or `undefined`; u64/s64 are BigInt;
// - a `result` is returned on success and thrown on error: throw the error variant
//   (`{ tag: 'not-found', val: 'message' }`); imported functions throw the same way (the
//   variant is in the error's `payload`).
//
// Stateless: everything it knows comes from the volume record; what it learns goes back in the
// model update (provider_location, and a driver-data key per connected initiator).

import { log } from 'berth:driver/log@0.3.0';
import { get as setting } from 'berth:driver/config@0.3.0';
import * as iscsi from 'berth:driver/iscsi-target@0.3.0';
import * as stores from 'berth:driver/backing-store@0.3.0';
import * as accounts from 'berth:iscsi-chap/initiator-accounts@0.1.0';

const DEFAULT_PREFIX = 'iqn.2010-10.org.openstack:';

// ---- errors -------------------------------------------------------------------------------

const error = (tag, val) => ({ tag, val });
const missing = (key) =>
  error('invalid-connector', { missing: [key], reason: `Connector doesn't have required information: ${key}` });
const invalidConnector = (reason) => error('invalid-connector', { missing: [], reason });

// A capability's error variant, from what an imported function threw.
const variantOf = (e) => (e && e.payload && e.payload.tag ? e.payload : e && e.tag ? e : { tag: 'failed', val: String(e) });

function targetError(what, e) {
  const { tag, val } = variantOf(e);
  switch (tag) {
    case 'not-found': return error('not-found', `${what}: ${val}`);
    case 'timeout': return error('retryable', `${what}: ${val}`);
    default: return error('backend', `${what}: ${tag}: ${val}`);
  }
}

function storeError(what, e) {
  const { tag, val } = variantOf(e);
  switch (tag) {
    case 'not-found': return error('not-found', `${what}: ${val}`);
    case 'conflict': return error('incompatible', `${what}: ${val}`);
    case 'no-space': return error('retryable', `${what}: ${val}`);
    default: return error('backend', `${what}: ${tag}: ${val}`);
  }
}

// Calls an imported function, turning what it throws into the driver's error.
function attempt(f, wrap) {
  try {
    return f();
  } catch (e) {
    throw wrap(e);
  }
}

// ---- names --------------------------------------------------------------------------------

// RFC 3720 iSCSI names, as the host checks them: lower-case iqn./eui./naa. forms, <= 223 bytes.
// An iqn name: `iqn.<yyyy>-<mm>.<reversed domain>[:<a-z0-9.:->...]`, the domain's labels neither
// empty nor starting or ending with a hyphen. One expression, tested once: a match's array, a
// split and a closure per label cost the interpreter more than the test (an attach's calls
// 0.09 M instructions fewer than with five steps).
const LABEL = '[a-z0-9](?:[a-z0-9-]*[a-z0-9])?';
const ISCSI_NAME = new RegExp(
  `^(?:iqn\\.\\d{4}-(?:0[1-9]|1[0-2])\\.${LABEL}(?:\\.${LABEL})*(?::[a-z0-9.:-]+)?` +
    '|eui\\.[0-9a-f]{16}|naa\\.(?:[0-9a-f]{16}|[0-9a-f]{32}))$',
);

const isIscsiName = (name) => typeof name === 'string' && name.length <= 223 && ISCSI_NAME.test(name);

function initiatorOf(connector) {
  if (connector.initiator === undefined) throw missing('initiator');
  if (!isIscsiName(connector.initiator)) throw invalidConnector(`initiator: not a valid iSCSI name`);
  return connector.initiator;
}

const sameInitiator = (a, b) => a.initiator !== undefined && a.initiator === b.initiator;

// ---- the volume record --------------------------------------------------------------------

const targetIqn = (volume) => `${setting('target_prefix') ?? DEFAULT_PREFIX}${volume.name}`;
const lun = () => Number(setting('target_lun') ?? '1');
const modeKey = (initiator) => `mode.${initiator}`;
const data = (volume, key) => volume.driverData.find(([k]) => k === key)?.[1];
const modeKeys = (volume) => volume.driverData.map(([k]) => k).filter((k) => k.startsWith('mode.'));

// `<portal>[;<portal>...],<tid> <iqn> <lun>`, Cinder's provider_location.
function location(volume) {
  const notExported = error('not-found', `volume ${volume.id} is not exported`);
  const text = volume.providerLocation;
  if (!text || !text.includes(',')) throw notExported;
  const [portals, rest] = [text.slice(0, text.indexOf(',')), text.slice(text.indexOf(',') + 1)];
  const [, iqn, l] = rest.split(/\s+/);
  if (!iqn) throw notExported;
  return { portals: portals.split(';'), iqn, lun: Number(l ?? '1') };
}

const portalText = (p) => (p.address.includes(':') ? `[${p.address}]:${p.port}` : `${p.address}:${p.port}`);

function update(fields = {}) {
  return {
    providerLocation: fields.providerLocation,
    providerAuth: fields.providerAuth,
    providerId: undefined,
    clear: fields.clear ?? [],
    setData: fields.setData ?? [],
    removeData: fields.removeData ?? [],
  };
}

const text = (v) => ({ tag: 'text', val: v });
const integer = (v) => ({ tag: 'integer', val: BigInt(v) });
const boolean = (v) => ({ tag: 'boolean', val: v });

// ---- the contract -------------------------------------------------------------------------

export const driver = {
  info() {
    return {
      name: 'js-iscsi',
      version: '0.3.0',
      vendor: 'Berth',
      description: 'A JavaScript driver: sparse backing stores exported over iSCSI with CHAP and per-initiator ACLs',
      protocols: [{ tag: 'iscsi' }],
      capabilities: { multiattach: true, sharedTargets: false },
    };
  },

  guarantees() {
    return ['terminate-ends-sessions'];
  },

  validateConnector(connector) {
    initiatorOf(connector);
  },

  createVolume(volume) {
    attempt(() => stores.create(volume.name, volume.sizeGib * 1024n * 1024n * 1024n), (e) => storeError('create backing store', e));
    return update();
  },

  // Grows the backing store (sparse: nothing is written). The host opens an attached volume's LUN
  // again as its store grows, so its hosts see the new size at once.
  extendVolume(volume, newSizeGib) {
    attempt(() => stores.resize(volume.name, newSizeGib * 1024n * 1024n * 1024n), (e) => storeError('grow backing store', e));
    return update();
  },

  deleteVolume(volume) {
    attempt(() => iscsi.deleteTarget(targetIqn(volume)), (e) => targetError('delete target', e));
    attempt(() => stores['delete'](volume.name), (e) => storeError('delete backing store', e));
  },

  createExport(volume, _connector) {
    // Each call of an import costs a ComponentizeJS driver about 0.1 million instructions (its
    // bindings copy the arguments and the result through the memory): a setting is read once.
    // Each initiator's account is bound at its initialize-connection, before its ACL entry: until
    // then the target admits nobody.
    const iqn = targetIqn(volume);
    const unit = lun();
    const target =
      attempt(() => iscsi.showTarget(iqn), (e) => targetError('show target', e)) ??
      attempt(() => iscsi.createTarget(iqn), (e) => targetError('create target', e));
    if (!target.luns.includes(unit)) {
      attempt(() => iscsi.addLun(iqn, unit, volume.name), (e) => targetError('add LUN', e));
    }
    const portals = iscsi.portals().map(portalText);
    if (portals.length === 0) throw error('backend', 'the host has no iSCSI portal configured');
    log('debug', `exported ${volume.id} as ${iqn} (tid ${target.tid})`);
    return update({
      providerLocation: `${portals.join(';')},${target.tid} ${iqn} ${unit}`,
      // Credentials of an account per export, from a build of this driver before 0.3.0.
      clear: volume.providerAuth !== undefined ? ['provider-auth'] : [],
    });
  },

  removeExport(volume) {
    attempt(() => iscsi.deleteTarget(targetIqn(volume)), (e) => targetError('delete target', e));
    return update({ removeData: modeKeys(volume), clear: ['provider-auth'] });
  },

  initializeConnection(volume, connector) {
    const initiator = initiatorOf(connector);
    const loc = location(volume);
    const mode = connector.mode;
    const previous = data(volume, modeKey(initiator));
    if (previous !== undefined && previous !== mode) {
      throw error('incompatible', `initiator ${initiator} is already connected ${previous}; it cannot get ${mode} access as well`);
    }
    // The initiator's own account is bound before its ACL entry exists, so that the target never
    // admits it without CHAP.
    const credentials = attempt(() => accounts.grant(loc.iqn, initiator), (e) => targetError('grant CHAP account', e));
    attempt(() => iscsi.allowInitiator(loc.iqn, initiator), (e) => targetError('allow initiator', e));
    const info = [
      ['target_discovered', boolean(false)],
      ['target_portal', text(loc.portals[0])],
      ['target_iqn', text(loc.iqn)],
      ['target_lun', integer(loc.lun)],
      ['volume_id', text(volume.id)],
      ['auth_method', text('CHAP')],
      ['auth_username', text(credentials.username)],
      ['auth_password', text(credentials.secret)],
      ['access_mode', text(mode)],
      ['encrypted', boolean(false)],
    ];
    if (loc.portals.length > 1 || connector.multipath) {
      const n = loc.portals.length;
      info.push(['target_portals', { tag: 'text-list', val: loc.portals }]);
      info.push(['target_iqns', { tag: 'text-list', val: Array(n).fill(loc.iqn) }]);
      info.push(['target_luns', { tag: 'integer-list', val: Array(n).fill(BigInt(loc.lun)) }]);
    }
    return {
      info: { driverVolumeType: 'iscsi', data: info },
      update: update({ setData: [[modeKey(initiator), mode]] }),
    };
  },

  terminateConnection(volume, connector, others) {
    const iqn = targetIqn(volume);
    let revoke = [];
    if (connector === undefined) {
      // Force detach: everyone goes, whether in the ACL or still logged in.
      const target = attempt(() => iscsi.showTarget(iqn), (e) => targetError('show target', e));
      if (target) {
        const sessions = attempt(() => iscsi.listSessions(iqn), (e) => targetError('list sessions', e));
        const loggedIn = sessions.map((s) => s.initiator).filter(isIscsiName);
        revoke = [...new Set([...target.initiators, ...loggedIn])].sort();
      }
    } else if (connector.initiator !== undefined && isIscsiName(connector.initiator)) {
      // Another live attachment from the same initiator still needs the ACL entry.
      const needed = others.some((a) => a.connector !== undefined && sameInitiator(a.connector, connector));
      if (!needed) revoke = [connector.initiator];
    }
    for (const initiator of revoke) {
      attempt(() => iscsi.denyInitiator(iqn, initiator), (e) => targetError('deny initiator', e));
      // The target checks its ACL only at login: end the sessions already open.
      attempt(() => iscsi.closeSessions(iqn, initiator), (e) => targetError('close sessions', e));
      // Its own account goes last: the target keeps requiring CHAP of those still admitted.
      attempt(() => accounts.revoke(iqn, initiator), (e) => targetError('revoke CHAP account', e));
    }
    if (connector === undefined) {
      attempt(() => accounts.revokeAll(iqn), (e) => targetError('revoke CHAP accounts', e));
    }
    const removeData = connector === undefined ? modeKeys(volume) : revoke.map(modeKey);
    return {
      exportInUse: connector !== undefined && others.some((a) => a.connector !== undefined),
      update: update({ removeData }),
    };
  },

  sharedConnections(_volume, connector, attachments) {
    return attachments
      .filter((a) => a.connector !== undefined && sameInitiator(a.connector, connector))
      .map((a) => a.id);
  },
};

// ---- warm-up ------------------------------------------------------------------------------

// ComponentizeJS runs this module's top level once, when the component is built, and ships the
// engine as it stands afterwards: what runs here is parsed, compiled and has its regular
// expressions compiled in every instance from the start. Only the pure paths of every operation
// (no import can be called while the component is built), with made-up values.
{
  const initiator = 'iqn.1993-08.org.debian:01:warm-up';
  driver.validateConnector({ initiator });
  for (const name of ['eui.0123456789abcdef', 'naa.0123456789abcdef', 'not a name']) isIscsiName(name);
  const volume = {
    id: 'warm-up',
    providerLocation: '127.0.0.1:3260;[::1]:3260,1 iqn.2010-10.org.openstack:warm-up 1',
    driverData: [[modeKey(initiator), 'rw']],
  };
  location(volume);
  data(volume, modeKey(initiator));
  modeKeys(volume);
  portalText({ address: '::1', port: 3260 });
  update({ setData: [[modeKey(initiator), 'rw']], removeData: [], clear: ['provider-auth'] });
  [text('x'), integer(1), boolean(true)];
  driver.sharedConnections(volume, { initiator }, [{ id: 'a', connector: { initiator } }]);
  variantOf({ payload: { tag: 'not-found', val: 'x' } });
  targetError('warm-up', { payload: { tag: 'timeout', val: 'x' } });
  storeError('warm-up', { payload: { tag: 'no-space', val: 'x' } });
}
