"""openstacksdk's block-storage proxy against Berth, unchanged: volumes and attachments (create
with a connector, get, list, complete, delete), a volume's update, the project's quotas and (an admin's)
disabling and enabling the backend, with its pools. Prints one line per step for tests/openstacksdk.rs
and tests/keystone.rs to check.

  openstacksdk_attachments.py ENDPOINT   a token endpoint, as a keystone-less deployment does
                                         (the token is noauth's `user:project`)
  openstacksdk_attachments.py keystone   password authentication from the OS_* environment; the
                                         endpoint comes from Keystone's catalog"""
import sys, json, openstack
from keystoneauth1 import session as ks
from keystoneauth1.token_endpoint import Token
if sys.argv[1] == "keystone":
    conn = openstack.connect(block_storage_api_version="3")
else:
    endpoint = sys.argv[1]
    sess = ks.Session(auth=Token(endpoint=endpoint + "/v3", token="sdk:p1"))
    conn = openstack.connection.Connection(session=sess, block_storage_endpoint_override=endpoint + "/v3/", block_storage_api_version="3")
bs = conn.block_storage
v = bs.wait_for_status(bs.create_volume(size=1, name="sdk"), status="available", wait=30)
connector = {"initiator": "iqn.1993-08.org.debian:01:sdk", "host": "sdk-host", "ip": "127.0.0.1", "platform": "x86_64", "os_type": "linux", "multipath": False}
a = bs.create_attachment(v, connector=connector, instance_id=None)
print("created", a.id, a.status, a.connection_info and sorted(a.connection_info)[:3])
g = bs.get_attachment(a.id)
print("got", g.id, g.status, g.volume_id == v.id)
print("listed", [x.id for x in bs.attachments()])
bs.complete_attachment(a.id)
print("completed", bs.get_attachment(a.id).status, bs.get_volume(v.id).status)
bs.delete_attachment(a.id, ignore_missing=False)
print("deleted", bs.get_volume(v.id).status, list(bs.attachments()))
u = bs.update_volume(v, name="sdk-renamed", description="renamed by openstacksdk")
print("updated", bs.get_volume(v.id).name, bs.get_volume(v.id).description == "renamed by openstacksdk")
q = bs.get_quota_set(conn.current_project_id or "p1", usage=True)
print("quotas", q.volumes, q.snapshots, q.usage["volumes"], q.usage["gigabytes"])
print("snapshots and backups", list(bs.snapshots()), list(bs.backups()))
print("groups", list(bs.groups()), list(bs.group_snapshots()), list(bs.group_types()))
if sys.argv[1] != "keystone":
    # An admin's (noauth callers are): drain the backend and see its pool go, then enable it.
    svc = list(bs.services(binary="cinder-volume"))[0]
    bs.disable_service(svc, reason="sdk drain")
    drained = [(s.status, s.disabled_reason) for s in bs.services(binary="cinder-volume")]
    print("disabled", drained, [p.name for p in bs.backend_pools()])
    bs.enable_service(svc)
    print("enabled", [s.status for s in bs.services(binary="cinder-volume")], [p.name.endswith("@fake#fake") for p in bs.backend_pools()])
