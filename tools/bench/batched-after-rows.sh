#!/usr/bin/env bash
# The batched publish row as the side-by-side run meets it: on a fresh
# server, first the publish rows that come before it in tools/bench/bench.sh
# (DIV=4, three repetitions each: 12,500 at 1 in flight, 50,000 at 64 and
# at 1024), then 50,000 batched (--window 1024 --batch 100) three times.
#
#   tools/bench/batched-after-rows.sh BIN [BIN ...]
#
# For each binary in turn prints the batched row's three results, the
# applier thread's CPU seconds (`letterbox-apply`, from /proc) and the
# writes the applier left out (letterbox_apply_writes_overtaken_total).
# Run it several times and compare the builds pair by pair: the machine
# drifts.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
LOADGEN=${LOADGEN:-$TARGET_DIR/release/loadgen}
for bin in "$@"; do
    work=$(mktemp -d)
    serve_letterbox "$work" "$bin" --data-dir "$work/data" --listen 127.0.0.1:0 \
        --metrics-listen 127.0.0.1:0
    server=$SERVER_PID url=$SERVER_URL
    metrics=$(announced "$work" "$LETTERBOX_METRICS_LINE")
    row() {
        "$LOADGEN" run --target letterbox --letterbox-url "$url" \
            --reps 3 "$@" 2>&1 | grep -v '^{' | grep 'msg/s' | sed 's/.*\] //'
    }
    row --workload publish-durable --window 1 --count 12500 --max-secs 45 > /dev/null
    row --workload publish-durable --window 64 --count 50000 --max-secs 60 > /dev/null
    row --workload publish-durable --window 1024 --count 50000 --max-secs 60 > /dev/null
    batched=$(row --workload publish-durable --window 1024 --batch 100 --count 50000 --max-secs 60 |
        sed 's/ p50.*//' | paste -sd '|')
    apply=$(thread_cpu_s "$server" letterbox-apply)
    overtaken=$(curl -s "$metrics" | awk '/^letterbox_apply_writes_overtaken_total/ { print $2 }')
    echo "$bin  batched: $batched  applier ${apply} s  overtaken ${overtaken:-?}"
    stop_pid "$server"
    rm -rf "$work"
done
