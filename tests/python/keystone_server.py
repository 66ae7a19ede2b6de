"""A real Keystone (from PyPI) for Berth's tests, and what the tests set up in it. Run with the
interpreter of the virtualenv Keystone is installed in (.ci/setup: target/keystone-venv).

  keystone_server.py init DIR ADMIN_PASSWORD PORT   keystone.conf (SQLite), db_sync, fernet and credential
                                             keys, bootstrap (admin, the identity endpoint)
  keystone_server.py serve DIR PORT                 serves Keystone on 127.0.0.1:PORT until stdin closes
                                             (so it stops with the test process that started it),
                                             then removes DIR
  keystone_server.py populate URL ADMIN_PASSWORD    the tests' projects, users and roles; prints their ids
  keystone_server.py register URL ADMIN_PASSWORD REGION VOLUME_URL
                                             Berth in the catalog of REGION, as block-storage and
                                             volumev3 (public endpoint VOLUME_URL/v3/$(project_id)s)

Only the standard library is used for the API calls, so that what the tests check is Berth and the
clients, not a helper."""
import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request

USERS = {
    # name: (project, role, password)
    "berth": ("service", "service", "berth-service-pw"),
    "nova": ("service", "service", "nova-service-pw"),
    "alice": ("demo", "member", "alice-pw"),
    "rita": ("demo", "reader", "rita-pw"),
    "mallory": ("other", "member", "mallory-pw"),
    "root": ("demo", "admin", "root-pw"),
}


def init(d, admin_password, port):
    os.makedirs(d, exist_ok=True)
    conf = os.path.join(d, "keystone.conf")
    with open(conf, "w") as f:
        f.write(f"""[DEFAULT]
log_file = {d}/keystone.log
[database]
connection = sqlite:///{d}/keystone.db
[token]
provider = fernet
expiration = 3600
[fernet_tokens]
key_repository = {d}/fernet-keys
[fernet_receipts]
key_repository = {d}/fernet-keys
[credential]
key_repository = {d}/credential-keys
""")
    manage = os.path.join(os.path.dirname(sys.executable), "keystone-manage")
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True, check=True).stdout.strip()
    url = f"http://127.0.0.1:{port}/v3"
    for args in (
        ["db_sync"],
        ["fernet_setup", "--keystone-user", user, "--keystone-group", group],
        ["credential_setup", "--keystone-user", user, "--keystone-group", group],
        ["bootstrap", "--bootstrap-password", admin_password, "--bootstrap-admin-url", url,
         "--bootstrap-public-url", url, "--bootstrap-internal-url", url,
         "--bootstrap-region-id", "RegionOne"],
    ):
        subprocess.run([manage, "--config-file", conf] + args, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def serve(d, port):
    os.environ["OS_KEYSTONE_CONFIG_FILES"] = os.path.join(d, "keystone.conf")
    sys.argv = sys.argv[:1]  # oslo.config reads the command line
    from werkzeug.serving import make_server
    from keystone.wsgi.api import application

    # One request at a time: Keystone's SQLite database refuses concurrent writers ("database is
    # locked"), and token issue writes.
    server = make_server("127.0.0.1", port, application, threaded=False)

    def stop_when_stdin_closes():
        sys.stdin.read()
        shutil.rmtree(d, ignore_errors=True)
        os._exit(0)

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    print("serving", flush=True)
    server.serve_forever()


def call(url, method, path, token=None, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("X-Auth-Token", token)
    with urllib.request.urlopen(req) as r:
        text = r.read()
        return r.headers, (json.loads(text) if text else None)


def admin_token(url, password):
    headers, _ = call(url, "POST", "/v3/auth/tokens", body={"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": "admin", "domain": {"id": "default"}, "password": password}}},
        "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}})
    return headers["X-Subject-Token"]


def find_or_create(url, token, collection, key, body):
    _, listed = call(url, "GET", f"/v3/{collection}?name={body['name']}", token)
    if listed[collection]:
        return listed[collection][0]["id"]
    _, created = call(url, "POST", f"/v3/{collection}", token, {key: body})
    return created[key]["id"]


def populate(url, admin_password):
    t = admin_token(url, admin_password)
    roles = {r: find_or_create(url, t, "roles", "role", {"name": r})
             for r in ("service", "member", "reader", "admin")}
    projects = {p: find_or_create(url, t, "projects", "project", {"name": p, "domain_id": "default"})
                for p in ("service", "demo", "other")}
    users = {}
    for name, (project, role, password) in USERS.items():
        uid = find_or_create(url, t, "users", "user",
                             {"name": name, "domain_id": "default", "password": password})
        call(url, "PUT", f"/v3/projects/{projects[project]}/users/{uid}/roles/{roles[role]}", t)
        users[name] = uid
    print(json.dumps({"projects": projects, "users": users,
                      "passwords": {n: u[2] for n, u in USERS.items()}}))


def register(url, admin_password, region, volume_url):
    t = admin_token(url, admin_password)
    call(url, "POST", "/v3/regions", t, {"region": {"id": region}})
    for kind, name in (("block-storage", "cinder"), ("volumev3", "cinderv3")):
        _, s = call(url, "POST", "/v3/services", t, {"service": {"type": kind, "name": name}})
        call(url, "POST", "/v3/endpoints", t, {"endpoint": {
            "service_id": s["service"]["id"], "interface": "public", "region_id": region,
            "url": volume_url.rstrip("/") + "/v3/$(project_id)s"}})


def register_compute(url, admin_password, region, compute_url):
    """A compute (Nova) endpoint in `region` (created if it is new)."""
    t = admin_token(url, admin_password)
    try:
        call(url, "POST", "/v3/regions", t, {"region": {"id": region}})
    except urllib.error.HTTPError as e:
        if e.code != 409:
            raise
    _, s = call(url, "POST", "/v3/services", t, {"service": {"type": "compute", "name": "nova"}})
    call(url, "POST", "/v3/endpoints", t, {"endpoint": {
        "service_id": s["service"]["id"], "interface": "public", "region_id": region,
        "url": compute_url}})


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "init":
        init(args[0], args[1], int(args[2]))
    elif command == "serve":
        serve(args[0], int(args[1]))
    elif command == "populate":
        populate(args[0], args[1])
    elif command == "register":
        register(*args)
    elif command == "register-compute":
        register_compute(*args)
    else:
        sys.exit(f"unknown command {command}")
