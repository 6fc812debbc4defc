#!/usr/bin/env bash
# Restart time of a data directory: starts `letterbox serve` on it N times,
# each time measuring spawn to the first successful call (`queue list`),
# then kills it with SIGKILL. The data directory must hold a stopped
# server's data (fill it first, e.g. with `letterbox publish --stdin`).
#
#   tools/restart-time.sh DATA_DIR [N] [extra serve flags...]
set -euo pipefail
dir=${1:?usage: tools/restart-time.sh DATA_DIR [N] [serve flags...]}
n=${2:-5}
shift $(( $# >= 2 ? 2 : 1 ))
bin=${LETTERBOX_BIN:-target/release/letterbox}
addr=127.0.0.1:50091
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for i in $(seq 1 "$n"); do
  start=$(date +%s%N)
  "$bin" serve --data-dir "$dir" --listen "$addr" --metrics-listen 127.0.0.1:50092 "$@" >"$log" 2>&1 &
  pid=$!
  until LETTERBOX_SERVER="http://$addr" "$bin" queue list >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
    sleep 0.02
  done
  end=$(date +%s%N)
  rec=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'recovery_ms=[0-9]*' || true)
  echo "start $i: $(( (end - start) / 1000000 )) ms to the first call ($rec)"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
done
