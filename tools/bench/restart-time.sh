#!/usr/bin/env bash
# Restart time of a data directory: starts `letterbox serve` on it N times,
# each time measuring spawn to the first successful call (`queue list`),
# then kills it with SIGKILL. The data directory must hold a stopped
# server's data (fill it first, e.g. with `letterbox publish --stdin`).
#
#   tools/bench/restart-time.sh DATA_DIR [N] [extra serve flags...]
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
dir=${1:?usage: tools/bench/restart-time.sh DATA_DIR [N] [serve flags...]}
n=${2:-5}
shift $(( $# >= 2 ? 2 : 1 ))
bin=${LETTERBOX_BIN:-$TARGET_DIR/release/letterbox}
addr=127.0.0.1:$(free_port)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 1 "$n"); do
  start=$(date +%s%N)
  start_letterbox "$work" "$bin" --data-dir "$dir" --listen "$addr" --metrics-listen 127.0.0.1:0 "$@"
  # The measure is the first call that succeeds, not the announcement.
  until LETTERBOX_SERVER="http://$addr" "$bin" queue list >/dev/null 2>&1; do
    pid_alive "$SERVER_JOB" || { cat "$work/server.log"; exit 1; }
    sleep 0.02
  done
  end=$(date +%s%N)
  rec=$(sed 's/\x1b\[[0-9;]*m//g' "$work/server.log" | grep -o 'recovery_ms=[0-9]*' || true)
  echo "start $i: $(( (end - start) / 1000000 )) ms to the first call ($rec)"
  kill_pid "$SERVER_JOB"
done
