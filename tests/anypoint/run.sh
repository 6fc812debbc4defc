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
# server is not built yet. Without that Python, or when PyPI does not
# answer, it skips (exit code 77, the skip rule of tests/common.sh). Everything goes under target/ (never committed):
#   target/anypoint-venv/      the virtualenv, reused while requirements.txt
#                              and the Python version are unchanged
#   target/anypoint-contract/  the specifications with Letterbox's documented
#                              deviations applied, and schemathesis's logs
# The server is built (cargo build --bin letterbox) only if
# target/debug/letterbox is missing; after changing the server, build it
# again yourself, or point LETTERBOX_BIN at another binary. The shared
# steps are in tests/common.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

. tests/common.sh

test_venv target/anypoint-venv tests/anypoint/requirements.txt
test_server

log "running tests/anypoint/contract.py"
LETTERBOX_BIN="$server" exec "$py" tests/anypoint/contract.py
