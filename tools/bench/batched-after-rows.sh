#!/usr/bin/env bash
# The batched publish row as the side-by-side run meets it: on a fresh
# server, first the publish rows that come before it in tools/bench.sh
# (DIV=4, three repetitions each: 12,500 at 1 in flight, 50,000 at 64 and
# at 1024), then 50,000 batched (--window 1024 --batch 100) three times.
#
#   tools/batched-after-rows.sh BIN [BIN ...]
#
# For each binary in turn prints the batched row's three results, the
# applier thread's CPU seconds (`letterbox-apply`, from /proc) and the
# writes the applier left out (letterbox_apply_writes_overtaken_total).
# Run it several times and compare the builds pair by pair: the machine
# drifts.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
LOADGEN=${LOADGEN:-$HERE/target/release/loadgen}
PORT=${PORT:-7413}
for bin in "$@"; do
    work=$(mktemp -d)
    "$bin" serve --data-dir "$work/data" --listen "127.0.0.1:$PORT" \
        --metrics-listen "127.0.0.1:$((PORT + 1))" > "$work/log" 2>&1 &
    for _ in $(seq 100); do
        grep -q "127.0.0.1:$PORT" "$work/log" 2>/dev/null && break
        sleep 0.1
    done
    server=$(pgrep -f "^$bin serve --data-dir $work/data" | head -1)
    row() {
        "$LOADGEN" run --target letterbox --letterbox-url "http://127.0.0.1:$PORT" \
            --reps 3 "$@" 2>&1 | grep -v '^{' | grep 'msg/s' | sed 's/.*\] //'
    }
    row --workload publish-durable --window 1 --count 12500 --max-secs 45 > /dev/null
    row --workload publish-durable --window 64 --count 50000 --max-secs 60 > /dev/null
    row --workload publish-durable --window 1024 --count 50000 --max-secs 60 > /dev/null
    batched=$(row --workload publish-durable --window 1024 --batch 100 --count 50000 --max-secs 60 |
        sed 's/ p50.*//' | paste -sd '|')
    apply=0
    for t in /proc/"$server"/task/*; do
        if grep -q letterbox-apply "$t/comm" 2>/dev/null; then
            apply=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "$t/stat")
        fi
    done
    overtaken=$(curl -s "http://127.0.0.1:$((PORT + 1))/metrics" |
        awk '/^letterbox_apply_writes_overtaken_total/ { print $2 }')
    echo "$bin  batched: $batched  applier ${apply} s  overtaken ${overtaken:-?}"
    kill -TERM "$server"
    wait "$server" 2> /dev/null || true
    rm -rf "$work"
done
