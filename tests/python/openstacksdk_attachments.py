"""openstacksdk's block-storage proxy against Berth, unchanged: volumes and attachments (create
with a connector, get, list, complete, delete). Authenticates with a token endpoint, as a
keystone-less deployment does (the token is noauth's `user:project`). Prints one line per step for
tests/openstacksdk.rs to check."""
import sys, json, openstack
from keystoneauth1 import session as ks
from keystoneauth1.token_endpoint import Token
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
