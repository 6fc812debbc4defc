#!/usr/bin/env bash
# The Python client test, from nothing: a virtualenv with the pinned
# grpcio/grpcio-tools, the server binary, the client generated from proto/,
# then tests/python/test_core_flow.py against a real server.
#
#   bash tests/python/run.sh
#
# Needs a system Python 3.10+ with the venv module (PYTHON chooses it,
# default python3), access to PyPI on the first run, and cargo if the
# server is not built yet. Without that Python, or when PyPI does not
# answer, it skips (exit code 77, the skip rule of tests/common.sh). Everything goes under target/ (never committed):
#   target/python-venv/    the virtualenv, reused while requirements.txt and
#                          the Python version are unchanged
#   target/python-client/  the generated client, regenerated every run
# The server is built (cargo build --bin letterbox) only if
# target/debug/letterbox is missing; after changing the server, build it
# again yourself, or point LETTERBOX_BIN at another binary. The shared
# steps are in tests/common.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

client=target/python-client
. tests/common.sh

# 1. The virtualenv, with the requirements.
test_venv target/python-venv tests/python/requirements.txt

# 2. The server.
test_server

# 3. The client, generated from proto/.
log "generating the Python client"
PYTHON="$py" tests/python/generate.sh "$client"

# 4. The test.
log "running tests/python/test_core_flow.py"
LETTERBOX_BIN="$server" LETTERBOX_PY_CLIENT="$root/$client" \
  exec "$py" tests/python/test_core_flow.py
