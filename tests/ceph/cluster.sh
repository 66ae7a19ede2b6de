#!/usr/bin/env bash
# A throw-away Ceph cluster for Berth's tests and benchmarks: one monitor, one manager with the
# dashboard's REST API on plain HTTP, one OSD (BlueStore on a sparse file), all on 127.0.0.1 and
# all under one directory. Needs root and Debian 12's Ceph 16 (`.ci/setup` installs it); no kernel
# module, loop device or systemd.
#
#   cluster.sh start DIR [--ports BASE]   bootstrap DIR (or restart what stopped) and print KEY=value
#   cluster.sh stop DIR [--kill]          stop its daemons (SIGTERM, or SIGKILL), and wait for them
#   cluster.sh purge DIR                  stop, then remove DIR
#
# Ports: BASE (default 21000) is the monitor's msgr2 port, BASE+1 its v1 port, BASE+2 the
# dashboard, BASE+10..BASE+49 the OSD's and manager's messengers. They are written into DIR's
# ceph.conf at the first start and kept. The pool is `volumes` (8 PGs, one replica), its clients
# `client.cinder` (`profile rbd pool=volumes`, key in DIR/ceph.client.cinder.keyring), and the
# dashboard's account `berth` (role berth-rbd: images, and reading the monitors), password in
# DIR/dashboard.password (mode 0600), and `client.berth-host`, which may make and remove the
# identities named `client.berth.*` (Berth's `cephx` capability), key in
# DIR/ceph.client.berth-host.keyring.
set -euo pipefail

die() { echo "cluster.sh: $*" >&2; exit 1; }
T0=$EPOCHREALTIME
say() { printf 'cluster.sh: [%5.1fs] %s\n' "$(awk "BEGIN{print $EPOCHREALTIME - $T0}")" "$*" >&2; }

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: cluster.sh start|stop|purge DIR [--ports BASE] [--kill]"
shift 2
base=21000; signal=TERM
while [ $# -gt 0 ]; do
  case "$1" in
    --ports) base=$2; shift 2 ;;
    --kill) signal=KILL; shift ;;
    *) die "unknown option $1" ;;
  esac
done
mkdir -p "$dir"; dir=$(cd "$dir" && pwd); conf=$dir/ceph.conf
daemons=(mon.a osd.0 mgr.x)

# The pid of a daemon of this directory, if it runs (its command line names this ceph.conf).
pid_of() {
  local f=$dir/run/$1.pid p
  [ -s "$f" ] || return 1
  p=$(cat "$f")
  [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' < "/proc/$p/cmdline" | grep -qF -- "$conf" && echo "$p"
}

stop() {
  local d p pids=()
  for d in "${daemons[@]}"; do
    if p=$(pid_of "$d"); then kill "-$signal" "$p" 2>/dev/null || true; pids+=("$p"); fi
  done
  # Until each is gone: a killed OSD's threads hold its store's lock until they all exit.
  for p in "${pids[@]}"; do
    for _ in $(seq 1 300); do
      [ -d "/proc/$p" ] || break
      [ "$(awk '/^State:/{print $2}' "/proc/$p/status" 2>/dev/null)" = Z ] && \
        [ "$(ls "/proc/$p/task" 2>/dev/null | wc -l)" -le 1 ] && break
      sleep 0.1
    done
  done
  say "stopped (${#pids[@]} daemons, SIG$signal)"
}

case "$cmd" in
  stop) stop; exit 0 ;;
  purge) stop; [ -f "$conf" ] && grep -q '^# cluster.sh' "$conf" && rm -rf "$dir"; exit 0 ;;
  start) ;;
  *) die "unknown command $cmd" ;;
esac

[ "$(id -u)" = 0 ] || die "must run as root"
for b in ceph ceph-mon ceph-osd ceph-mgr ceph-authtool monmaptool rbd rados curl uuidgen; do
  command -v "$b" >/dev/null || die "$b is missing: apt-get install ceph-mon ceph-osd ceph-mgr ceph-mgr-dashboard ceph-common curl uuid-runtime"
done
mkdir -p "$dir"/{run,log,crash,mon.a,osd.0,mgr.x}

if [ ! -s "$conf" ]; then
  cat > "$conf.tmp" <<EOF
# cluster.sh: written on $(date -u +%FT%TZ)
[global]
fsid = $(uuidgen)
mon host = [v2:127.0.0.1:$base,v1:127.0.0.1:$((base + 1))]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
ms bind port min = $((base + 10))
ms bind port max = $((base + 49))
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $dir/run
crash dir = $dir/crash
keyring = $dir/ceph.\$name.keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# This machine's root shows little space as available (ext4's reserved blocks): the defaults
# warn at 30 % and stop the monitor at 5 %.
mon data avail warn = 2
mon data avail crit = 1
mon osd full ratio = .99
mon osd nearfull ratio = .98
mon osd backfillfull ratio = .985
osd failsafe full ratio = .995
# A lone OSD has no peer to report its death: beacons make the monitor notice in 45 s, not 900.
osd beacon report interval = 10
mon osd report timeout = 45
mgr initial modules = dashboard

[client]
admin socket =
log file = /dev/null
rados osd op timeout = 30
rados mon op timeout = 30
client mount timeout = 30

[mon]
mon data = $dir/mon.a
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
keyring = $dir/mon.a/keyring

[mgr]
mgr data = $dir/mgr.\$id
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
keyring = $dir/mgr.\$id/keyring

[osd]
osd data = $dir/osd.\$id
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
keyring = $dir/osd.\$id/keyring
osd objectstore = bluestore
bluestore block path = $dir/osd.\$id/block.file
bluestore block create = true
bluestore block size = $((10 * 1024 * 1024 * 1024))
osd memory target = 939524096
osd crush update on start = true
EOF
  mv "$conf.tmp" "$conf"
fi
base=$(sed -n 's/^mon host = \[v2:127.0.0.1:\([0-9]*\),.*/\1/p' "$conf")
ceph_=(ceph -c "$conf" -n client.admin --connect-timeout 15)
admin=$dir/ceph.client.admin.keyring

until_ok() { # WHAT COMMAND...
  local what=$1 end=$(( $(date +%s) + 180 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out waiting for $what (logs in $dir/log)"
    sleep 0.5
  done
  say "$what"
}
free() { for p in "$@"; do [ -z "$(ss -Hltn "sport = :$p" 2>/dev/null)" ] || die "port $p is taken (--ports BASE picks others; a directory keeps its ports)"; done; }

if [ ! -s "$admin" ]; then
  ceph-authtool --create-keyring "$admin.tmp" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  mv "$admin.tmp" "$admin"
fi
if [ ! -d "$dir/mon.a/store.db" ]; then
  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$admin" >/dev/null
  monmaptool --create --clobber --fsid "$(sed -n 's/^fsid = //p' "$conf")" \
    --addv a "[v2:127.0.0.1:$base,v1:127.0.0.1:$((base + 1))]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" --keyring "$dir/mon.keyring"
  rm -f "$dir/mon.keyring" "$dir/monmap"
fi
if ! pid_of mon.a >/dev/null; then
  free "$base" "$((base + 1))"
  ceph-mon -c "$conf" -i a 2>>"$dir/log/mon.a.stderr" || die "ceph-mon did not start (logs in $dir/log)"
fi
until_ok "monitor answers" "${ceph_[@]}" mon stat

if [ ! -s "$dir/osd.0/whoami" ]; then
  [ -s "$dir/osd.0/uuid.planned" ] || uuidgen > "$dir/osd.0/uuid.planned"
  key=$(ceph-authtool --gen-print-key)
  printf '{"cephx_secret": "%s"}\n' "$key" > "$dir/osd.0/new.json"
  "${ceph_[@]}" osd new "$(cat "$dir/osd.0/uuid.planned")" 0 -i "$dir/osd.0/new.json" >/dev/null
  rm -f "$dir/osd.0/new.json"
  printf '[osd.0]\n\tkey = %s\n' "$key" > "$dir/osd.0/keyring"
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$(cat "$dir/osd.0/uuid.planned")" >"$dir/log/osd.0.mkfs" 2>&1 \
    || die "ceph-osd --mkfs failed (logs in $dir/log)"
fi
pid_of osd.0 >/dev/null || ceph-osd -c "$conf" -i 0 2>>"$dir/log/osd.0.stderr" || die "ceph-osd did not start"

if [ ! -s "$dir/mgr.x/keyring" ]; then
  "${ceph_[@]}" auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' -o "$dir/mgr.x/keyring"
  # --force: no manager has declared its modules' options to the monitor yet.
  "${ceph_[@]}" config set mgr mgr/dashboard/ssl false --force
  "${ceph_[@]}" config set mgr mgr/dashboard/server_addr 127.0.0.1 --force
  "${ceph_[@]}" config set mgr mgr/dashboard/server_port "$((base + 2))" --force
  "${ceph_[@]}" config set mgr mgr/devicehealth/enable_monitoring false --force
fi
if ! pid_of mgr.x >/dev/null; then
  free "$((base + 2))"
  ceph-mgr -c "$conf" -i x 2>>"$dir/log/mgr.x.stderr" || die "ceph-mgr did not start"
fi
# The OSD's own word (the monitor may list a killed one as up for a while).
until_ok "OSD active" sh -c "ceph --admin-daemon '$dir/run/osd.0.asok' status | grep -q '\"state\": \"active\"'"

if ! "${ceph_[@]}" osd pool ls | grep -qx volumes; then
  "${ceph_[@]}" osd pool create volumes 8 8 replicated >/dev/null 2>&1
  rbd -c "$conf" -n client.admin pool init volumes
fi
if [ ! -s "$dir/ceph.client.cinder.keyring" ]; then
  "${ceph_[@]}" auth get-or-create client.cinder mon 'profile rbd' osd 'profile rbd pool=volumes' \
    -o "$dir/ceph.client.cinder.keyring"
fi
# The identity `berth serve` makes per-host identities as (the `cephx` capability): only
# identities named client.berth.*, and reading images' ids.
if [ ! -s "$dir/ceph.client.berth-host.keyring" ]; then
  p='with entity prefix client.berth.'
  "${ceph_[@]}" auth get-or-create client.berth-host \
    mon "allow r, allow command \"auth get-or-create\" $p, allow command \"auth caps\" $p, allow command \"auth get\" $p, allow command \"auth add\" $p, allow command \"auth del\" $p, allow command \"auth ls\"" \
    osd 'allow r object_prefix rbd_id., allow rx object_prefix rbd_directory' -o "$dir/ceph.client.berth-host.keyring"
  chmod 600 "$dir/ceph.client.berth-host.keyring"
fi
until_ok "dashboard listens" sh -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$((base + 2))/)\" = 200 ]"
# The dashboard may listen before the monitors know its module's commands (the manager reports them
# afterwards): `ceph dashboard ...` then fails with "no valid command found". Wait for them.
until_ok "dashboard commands" "${ceph_[@]}" dashboard ac-role-show
if [ ! -s "$dir/dashboard.password" ]; then
  ( umask 077; printf 'Berth-%s' "$(uuidgen | tr -d -)" > "$dir/dashboard.password" )
  # The least the driver needs: images, and reading the monitors' addresses.
  "${ceph_[@]}" dashboard ac-role-create berth-rbd "Berth's ceph-rbd driver" >/dev/null
  "${ceph_[@]}" dashboard ac-role-add-scope-perms berth-rbd rbd-image create read update delete >/dev/null
  "${ceph_[@]}" dashboard ac-role-add-scope-perms berth-rbd monitor read >/dev/null
  "${ceph_[@]}" dashboard ac-user-create --force-password berth -i "$dir/dashboard.password" berth-rbd >/dev/null
fi
# The manager connects its RADOS handle at the first request that needs it, and a request that
# arrives during that connect is refused ("RadosStateError ... in state configuring"): make that
# first request now, alone, with the driver's account.
dashboard_lists_images() {
  local url="http://127.0.0.1:$((base + 2))" token
  token=$(python3 -c 'import json, sys; print(json.dumps({"username": "berth", "password": open(sys.argv[1]).read()}))' \
      "$dir/dashboard.password" \
    | curl -sf -X POST -H 'Accept: application/vnd.ceph.api.v1.0+json' -H 'Content-Type: application/json' \
        --data-binary @- "$url/api/auth" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["token"])') || return 1
  curl -sf -o /dev/null -H "Authorization: Bearer $token" -H 'Accept: application/vnd.ceph.api.v2.0+json' \
    "$url/api/block/image?pool_name=volumes"
}
until_ok "dashboard reaches RADOS" dashboard_lists_images
until_ok "placement groups active+clean" sh -c "${ceph_[*]} pg stat | grep -Eq '^[0-9]+ pgs: [0-9]+ active\+clean;'"
until_ok "client.cinder writes" sh -c "echo ping | rados -c '$conf' -n client.cinder -p volumes put cluster-sh - && rados -c '$conf' -n client.cinder -p volumes rm cluster-sh"

cat <<EOF
CEPH_CONF=$conf
CEPH_MONITORS=127.0.0.1:$((base + 1))
CEPH_DASHBOARD=http://127.0.0.1:$((base + 2))
CEPH_DASHBOARD_USER=berth
CEPH_DASHBOARD_PASSWORD_FILE=$dir/dashboard.password
CEPH_CLIENT=cinder
CEPH_HOST_IDENTITY=client.berth-host
CEPH_POOL=volumes
EOF
say "serving"
