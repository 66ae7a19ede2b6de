#!/usr/bin/env bash
# Builds py-iscsi into a WebAssembly component with componentize-py (the version pinned in
# requirements.txt), from the WIT alone. `--stub-wasi` keeps Python's filesystem and socket
# imports inside the component, stubbed: Berth refuses components that import them.
#
#   pip install -r requirements.txt && ./build.sh [output.wasm]
set -euo pipefail
cd "$(dirname "$0")"
out=$(realpath -m "${1:-../../target/drivers/py-iscsi.wasm}")
mkdir -p "$(dirname "$out")"
"${COMPONENTIZE_PY:-componentize-py}" -d ../../wit/iscsi-chap@0.1.0 -w tgt-storage-driver \
    componentize --python-path . app --stub-wasi -o "$out"
