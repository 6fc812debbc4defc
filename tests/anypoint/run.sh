#!/usr/bin/env bash
# The contract test of the Anypoint MQ REST facade, from nothing: a
# virtualenv with the pinned schemathesis, the server binary, then
# tests/anypoint/contract.py (a scripted session whose every answer is
# checked against the official OpenAPI specifications, then schemathesis
# runs generated from them).
#
#   bash tests/anypoint/run.sh
#
# Needs a system Python 3.10+ with the venv module (PYTHON chooses it,
# default python3), access to PyPI on the first run, and cargo if the
# server is not built yet. Everything goes under target/ (never committed):
#   target/anypoint-venv/      the virtualenv, reused while requirements.txt
#                              and the Python version are unchanged
#   target/anypoint-contract/  the specifications with Letterbox's documented
#                              deviations applied, and schemathesis's logs
# The server is built (cargo build --bin letterbox) only if
# target/debug/letterbox is missing; after changing the server, build it
# again yourself, or point LETTERBOX_BIN at another binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

system_python="${PYTHON:-python3}"
venv=target/anypoint-venv
requirements=tests/anypoint/requirements.txt
stamp="$venv/.requirements.stamp"
server="${LETTERBOX_BIN:-target/debug/letterbox}"

log() { echo "== $*"; }

if ! "$venv/bin/python" -c '' 2>/dev/null; then
  log "creating virtualenv $venv with $("$system_python" --version 2>&1)"
  rm -rf "$venv"
  mkdir -p target
  "$system_python" -m venv "$venv"
fi
py="$venv/bin/python"

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

if [[ -x "$server" ]]; then
  log "server binary $server exists (not rebuilt)"
elif [[ -n "${LETTERBOX_BIN:-}" ]]; then
  echo "LETTERBOX_BIN=$LETTERBOX_BIN is not an executable file" >&2
  exit 1
else
  log "building the server: cargo build --bin letterbox"
  cargo build --bin letterbox
fi

log "running tests/anypoint/contract.py"
LETTERBOX_BIN="$server" exec "$py" tests/anypoint/contract.py
