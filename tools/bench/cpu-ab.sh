#!/usr/bin/env bash
# A/B of server builds by the CPU they spend on one workload.
#
#   tools/bench/cpu-ab.sh REPS BIN_A BIN_B [BIN ...] -- LOADGEN_RUN_ARGS...
#   tools/bench/cpu-ab.sh 3 /tmp/letterbox-before target/release/letterbox -- \
#       --workload publish-durable --window 1024 --batch 100 --count 150000
#
# For each repetition, each server binary in turn: start `BIN serve` on a
# fresh data directory under /usr/bin/time, run `loadgen run --target
# letterbox ARGS` against it, read the applier thread's CPU time
# (`letterbox-apply`, from /proc) when the load ends, stop the server with
# SIGTERM (a graceful stop applies what is left) and print one line:
# throughput, latency, the applier's CPU seconds and the server's whole CPU
# seconds (user + system, start to exit). Alternating the builds spreads
# the machine's drift over both; CPU seconds are steadier than throughput
# on a shared 2-core machine.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

REPS=$1
shift
BINS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    BINS+=("$1")
    shift
done
[ "${1:-}" = "--" ] || { echo "usage: $0 REPS BIN... -- LOADGEN_RUN_ARGS..." >&2; exit 2; }
shift
LOADGEN=${LOADGEN:-$TARGET_DIR/release/loadgen}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SERVE_WRAP=(/usr/bin/time -o "$WORK/time" -f "%U %S")

for rep in $(seq "$REPS"); do
    for i in "${!BINS[@]}"; do
        bin=${BINS[$i]}
        dir=$WORK/data
        rm -rf "$dir"
        serve_letterbox "$WORK" "$bin" --data-dir "$dir" --listen 127.0.0.1:0
        out=$("$LOADGEN" run --target letterbox --letterbox-url "$SERVER_URL" \
            --reps 1 "$@" 2>&1 | grep -v '^{' | grep 'msg/s' | sed 's/.*rep 1\] //')
        apply=$(thread_cpu_s "$SERVER_PID" letterbox-apply)
        kill -TERM "$SERVER_PID"
        wait "$SERVER_JOB" || true
        cpu=$(awk '{ printf "%.2f", $1 + $2 }' "$WORK/time")
        echo "rep $rep  build $((i + 1)) ($bin)  $out  applier ${apply} s  server ${cpu} s"
    done
done
