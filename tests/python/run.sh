#!/usr/bin/env bash
# The Python client test, from nothing: a virtualenv with the pinned
# grpcio/grpcio-tools, the server binary, the client generated from proto/,
# then tests/python/test_core_flow.py against a real server.
#
#   bash tests/python/run.sh
#
# Needs a system Python 3.10+ with the venv module (PYTHON chooses it,
# default python3), access to PyPI on the first run, and cargo if the
# server is not built yet. Everything goes under target/ (never committed):
#   target/python-venv/    the virtualenv, reused while requirements.txt and
#                          the Python version are unchanged
#   target/python-client/  the generated client, regenerated every run
# The server is built (cargo build --bin letterbox) only if
# target/debug/letterbox is missing; after changing the server, build it
# again yourself, or point LETTERBOX_BIN at another binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

system_python="${PYTHON:-python3}"
venv=target/python-venv
requirements=tests/python/requirements.txt
stamp="$venv/.requirements.stamp"
client=target/python-client
server="${LETTERBOX_BIN:-target/debug/letterbox}"

log() { echo "== $*"; }

# 1. The virtualenv; made again if its interpreter no longer runs (for
#    example after the system Python was upgraded).
if ! "$venv/bin/python" -c '' 2>/dev/null; then
  log "creating virtualenv $venv with $("$system_python" --version 2>&1)"
  rm -rf "$venv"
  mkdir -p target
  "$system_python" -m venv "$venv"
fi
py="$venv/bin/python"

# 2. The requirements, installed when requirements.txt or the interpreter
#    changed since the last successful install. Wheels only: nothing is
#    compiled, and a platform without wheels fails at once.
want_stamp="$("$py" -c 'import sys; print(sys.version)'; cat "$requirements")"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
  log "requirements already installed in $venv"
else
  log "installing $requirements into $venv"
  rm -f "$stamp"
  "$py" -m pip install --disable-pip-version-check --no-input --quiet \
    --only-binary=:all: -r "$requirements"
  printf '%s' "$want_stamp" > "$stamp"
fi

# 3. The server.
if [[ -x "$server" ]]; then
  log "server binary $server exists (not rebuilt)"
elif [[ -n "${LETTERBOX_BIN:-}" ]]; then
  echo "LETTERBOX_BIN=$LETTERBOX_BIN is not an executable file" >&2
  exit 1
else
  log "building the server: cargo build --bin letterbox"
  cargo build --bin letterbox
fi

# 4. The client, generated from proto/.
log "generating the Python client"
PYTHON="$py" tests/python/generate.sh "$client"

# 5. The test.
log "running tests/python/test_core_flow.py"
LETTERBOX_BIN="$server" LETTERBOX_PY_CLIENT="$root/$client" \
  exec "$py" tests/python/test_core_flow.py
