#!/usr/bin/env bash
# The metrics endpoint's scrape at many queues, both ways: /metrics (the
# queues' figures summed, the default), /metrics/per-queue, and /metrics
# with --metrics-per-queue (both in one page). For each: the bytes of a
# scrape and the time to its last byte, REPS scrapes one after another.
#
#   docs/benchmarks/2026-12-08/metrics-scrape/run.sh [OUT]
#
# BIN (target/release/letterbox), QUEUES (10000: every 10th with a dead
# letter queue of its own among them), REPS (20), PORT (19464).
set -euo pipefail
BIN=${BIN:-target/release/letterbox}
QUEUES=${QUEUES:-10000}
REPS=${REPS:-20}
PORT=${PORT:-19464}
OUT=${1:-/tmp/metrics-scrape}
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# QUEUES queues, every 10th (queue-0, queue-10, ...) the dead letter queue
# of the next one,
# and a fanout exchange bound to every queue, to put a message in each.
python3 - "$QUEUES" > "$work/defs.json" <<'PY'
import json, sys
n = int(sys.argv[1])
queues = []
for i in range(n):
    q = {"name": f"queue-{i}"}
    if i % 10 == 1:
        q["dead_letter"] = {"queue": f"queue-{i - 1}", "max_deliveries": 5}
    queues.append(q)
bindings = [{"exchange": "all", "queue": q["name"]} for q in queues]
print(json.dumps({"queues": queues, "exchanges": [{"name": "all"}], "bindings": bindings}))
PY

run() { # NAME, then the server's extra flags
    local name=$1; shift
    rm -rf "$work/data"
    "$BIN" serve --data-dir "$work/data" --listen 127.0.0.1:0 --console-listen off \
        --metrics-listen "127.0.0.1:$PORT" "$@" > "$work/out" 2> "$work/log" &
    pid=$!
    until grep -q 'listening on' "$work/out" 2>/dev/null; do sleep 0.1; done
    local grpc
    grpc=$(sed -n 's/^letterbox listening on //p' "$work/out")
    LETTERBOX_CONFIG_HOME="$work" "$BIN" definitions import "$work/defs.json" --server "http://$grpc" > /dev/null
    LETTERBOX_CONFIG_HOME="$work" "$BIN" publish --exchange all m --server "http://$grpc" > /dev/null
    for path in "${PATHS[@]}"; do
        for _ in $(seq "$REPS"); do
            curl -s -o /dev/null -w "$name $path %{size_download} %{time_total}\n" "http://127.0.0.1:$PORT$path"
        done
    done | tee -a "$OUT/scrapes.txt"
    kill "$pid"; wait "$pid" || true
}

: > "$OUT/scrapes.txt"
PATHS=(/metrics /metrics/per-queue)
run default
PATHS=(/metrics)
run per-queue-flag --metrics-per-queue

# Median and largest time, and the size, per way.
python3 - "$OUT/scrapes.txt" > "$OUT/report.md" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, path, size, secs = line.split()
    rows.setdefault((name, path), []).append((int(size), float(secs) * 1000))
print("| server | path | bytes | ms p50 | ms max |")
print("|---|---|---|---|---|")
for (name, path), v in rows.items():
    sizes = sorted(s for s, _ in v)
    ms = [t for _, t in v]
    print(f"| {name} | {path} | {sizes[len(sizes) // 2]:,} | {statistics.median(ms):.1f} | {max(ms):.1f} |")
PY
cat "$OUT/report.md"
