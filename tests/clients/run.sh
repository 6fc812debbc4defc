#!/usr/bin/env bash
# Runs a client example of examples/clients/ against a real server, the way
# docs/clients.md tells a reader to: install its packages, generate its
# client from proto/, run it, then checks what it printed.
#
#   bash tests/clients/run.sh python|node
#
# The example is copied to target/examples/LANG/ (never committed) and
# everything is installed there: for python a virtualenv with its
# requirements.txt (PyPI), for node its package-lock.json with `npm ci`
# (the npm registry). The copy sits as deep below the repository root as
# examples/clients/LANG/, so the example's relative path to proto/ holds.
#
# With LETTERBOX_ADDR set (and LETTERBOX_TOKEN, LETTERBOX_CA_CERT if that
# server wants them), the example runs against that server; otherwise the
# script starts `letterbox serve` on 127.0.0.1:0 with a fresh data
# directory (the binary as in tests/common.sh's test_server) and stops it
# with SIGTERM. Without python3 or npm, or when the registry does not
# answer, it skips (exit code 77, the skip rule of tests/common.sh).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. tests/common.sh
. tools/lib.sh

lang="${1:-}"
case "$lang" in
  python) files=(consume.py requirements.txt) ;;
  node) files=(consume.ts package.json package-lock.json tsconfig.json) ;;
  *) echo "usage: tests/clients/run.sh python|node" >&2; exit 2 ;;
esac
dir="target/examples/$lang"

log "copying examples/clients/$lang to $dir"
mkdir -p "$dir"
rm -rf "$dir/gen" "$dir/dist"
for f in "${files[@]}"; do cp "examples/clients/$lang/$f" "$dir/$f"; done

log "installing and generating the client"
case "$lang" in
  python)
    test_venv "$dir/.venv" "$dir/requirements.txt"
    (cd "$dir" && mkdir -p gen && .venv/bin/python -m grpc_tools.protoc -I ../../../proto \
      --python_out=gen --grpc_python_out=gen letterbox/v1/letterbox.proto)
    run=(.venv/bin/python consume.py)
    ;;
  node)
    npm_install "$dir" ci
    (cd "$dir" && npm run --silent generate && npm run --silent build)
    run=(node dist/consume.js)
    ;;
esac

tmp="$(mktemp -d)"
pid=""
cleanup() {
  [[ -n "$pid" ]] && kill -9 "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

if [[ -z "${LETTERBOX_ADDR:-}" ]]; then
  test_server
  log "starting $server"
  start_letterbox "$tmp" "$server" --data-dir "$tmp/data" --listen 127.0.0.1:0
  pid=$SERVER_JOB
  wait_letterbox "$tmp" 60
  export LETTERBOX_ADDR="$SERVER_ADDR"
fi

log "running ${run[*]} against $LETTERBOX_ADDR"
status=0
(cd "$dir" && "${run[@]}") >"$tmp/out" 2>&1 || status=$?
cat "$tmp/out"
if [[ -n "$pid" ]]; then
  kill -TERM "$pid"
  server_status=0
  wait "$pid" || server_status=$?
  pid=""
  if [[ "$server_status" != 0 ]]; then
    echo "the server exited with $server_status after SIGTERM:" >&2
    tail -n 40 "$tmp/server.log" >&2
    exit 1
  fi
fi
[[ "$status" == 0 ]] || { echo "the $lang example exited with $status" >&2; exit 1; }

# The scenario, as every example prints it.
failed=0
expect() { # expect COUNT REGEX WHAT
  local n
  n="$(grep -cE "$2" "$tmp/out" || true)"
  if [[ "$n" != "$1" ]]; then
    echo "expected $1 line(s) $3, found $n (/$2/)" >&2
    failed=1
  fi
}
id='[0-9A-Z]{26}'
expect 1 "^published $id\$" "publishing the message"
expect 3 "^delivery [123] of $id: lease extended to [0-9:.]+, nacked: payment service unavailable\$" \
  "for the three failed deliveries"
expect 1 "^dead letter: $id from example\\.payments, reason MAX_DELIVERIES after 3 deliveries, last nack reason \"payment service unavailable\", at [0-9:.]+\$" \
  "with the dead-letter record"
expect 1 '^redrive: moved 1 of 1 matched$' "for the redrive"
expect 1 "^delivery [0-9]+ of $id \\(dead-lettered 1 time\\(s\\) before\\): lease extended to [0-9:.]+, acked\$" \
  "for the acked delivery"
[[ "$(tail -n 1 "$tmp/out")" == done ]] || { echo "the last line is not 'done'" >&2; failed=1; }
[[ "$failed" == 0 ]] || exit 1
echo "PASS: the $lang client example against a real server"
