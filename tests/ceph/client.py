"""A compute host's librbd, for Berth's tests: opens the image a connection info names, as the
identity it names, through the monitors it names, and moves data.

    client.py MON_HOST USER KEYRING POOL/IMAGE write_read OFFSET FILE

writes FILE's bytes at OFFSET, reads them back and prints what was read (raw bytes) on stdout.
Any refusal (a cephx identity without access, a missing image) exits 1 with the error on stderr.
Run it with Debian's /usr/bin/python3 (python3-rbd).
"""

import sys

import rados
import rbd


def main():
    mon_host, user, keyring, spec, action = sys.argv[1:6]
    pool, image = spec.split("/", 1)
    cluster = rados.Rados(
        rados_id=user,
        conf={
            "mon_host": mon_host,
            "keyring": keyring,
            "rados_osd_op_timeout": "20",
            "rados_mon_op_timeout": "20",
            "client_mount_timeout": "20",
            "log_file": "/dev/null",
        },
    )
    cluster.connect(timeout=20)
    try:
        with cluster.open_ioctx(pool) as io:
            with rbd.Image(io, image) as img:
                if action == "write_read":
                    offset, path = int(sys.argv[6]), sys.argv[7]
                    data = open(path, "rb").read()
                    img.write(data, offset)
                    img.flush()
                    sys.stdout.buffer.write(img.read(offset, len(data)))
                else:
                    raise SystemExit(f"unknown action {action}")
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the test reads the reason
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
