#!/usr/bin/env bash
# Unary calls against the floor: one unary `Publish` per message on
# Letterbox, the same on `tonic-floor` (a bare tonic server of the same
# API with empty handlers, same tonic settings), and `PublishStream` on
# Letterbox, all driven by the same loadgen client code, at several
# in-flight windows, the rows interleaved within each repetition.
#
#   tools/bench/unary-floor.sh           # REPS=3 WINDOWS="1 64 1024" CONNS="1"
#   REPS=5 CONNS="1 4" OUT=/tmp/uf tools/bench/unary-floor.sh
#
# Variables: REPS (3), WINDOWS ("1 64 1024"), CONNS (HTTP/2 connections of
# the unary publisher, "1"; each value is a row of its own), ROWS
# ("floor unary stream"), SERVER (the letterbox binary, default the
# release build), OUT (a directory kept for the results; default a
# temporary one), CLIENT_THREADS (loadgen's runtime threads, 0 = one a
# core). Each result line carries the server's CPU seconds (`broker_cpu_s`)
# and loadgen's (`client_cpu_s`); the summary prints medians and min-max
# over the repetitions, and the server's CPU microseconds per message.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

SERVER=${SERVER:-$TARGET_DIR/release/letterbox}
FLOOR=${FLOOR:-$TARGET_DIR/release/tonic-floor}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/loadgen}
REPS=${REPS:-3}
WINDOWS=${WINDOWS:-1 64 1024}
CONNS=${CONNS:-1}
ROWS=${ROWS:-floor unary stream}
CLIENT_THREADS=${CLIENT_THREADS:-0}
FLOOR_PORT=${FLOOR_PORT:-7432}
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    WORK=$OUT
else
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
fi
RESULTS=$WORK/results.jsonl
: > "$RESULTS"

count_for() {
    case $1 in
        1) echo 3000 ;;
        64) echo 40000 ;;
        *) echo 80000 ;;
    esac
}

rm -rf "$WORK/data"
lb="" floor=""
trap 'for p in $lb $floor; do stop_pid "$p"; done; [ -n "${OUT:-}" ] || rm -rf "$WORK"' EXIT
start_letterbox "$WORK" "$SERVER" --data-dir "$WORK/data" --listen 127.0.0.1:0
lb=$SERVER_JOB
setsid "$FLOOR" --listen "127.0.0.1:$FLOOR_PORT" > "$WORK/floor.log" 2>&1 < /dev/null &
floor=$!
wait_letterbox "$WORK"
LB_URL=$SERVER_URL
wait_port "$FLOOR_PORT" 10 || { echo "tonic-floor did not open 127.0.0.1:$FLOOR_PORT:" >&2; cat "$WORK/floor.log" >&2; exit 1; }

run() { # row window conns rep
    local row=$1 w=$2 c=$3 rep=$4 target url pid mode
    case $row in
        floor) target=tonic-floor url=http://127.0.0.1:$FLOOR_PORT pid=$floor mode=unary ;;
        unary) target=letterbox url=$LB_URL pid=$lb mode=unary ;;
        stream) target=letterbox url=$LB_URL pid=$lb mode=stream ;;
        *) echo "unknown row $row" >&2; exit 2 ;;
    esac
    LOADGEN_LETTERBOX_PUBLISH=$mode LOADGEN_LETTERBOX_CONNECTIONS=$c "$LOADGEN" run \
        --target "$target" --letterbox-url "$url" --workload publish-durable \
        --window "$w" --count "$(count_for "$w")" --max-secs 30 --broker-pid "$pid" \
        --client-threads "$CLIENT_THREADS" --first-rep "$rep" \
        --label "$row,conns=$c" --out "$RESULTS" > /dev/null 2>> "$WORK/loadgen.log"
}

for rep in $(seq "$REPS"); do
    for w in $WINDOWS; do
        for c in $CONNS; do
            for row in $ROWS; do
                # A stream is one connection whatever CONNS says.
                if [ "$row" = stream ] && [ "$c" != "$(echo "$CONNS" | awk '{print $1}')" ]; then
                    continue
                fi
                run "$row" "$w" "$c" "$rep"
            done
        done
    done
    echo "rep $rep done" >&2
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    e = r.get("extra", {})
    key = (r["label"], r["params"]["window"])
    rows.setdefault(key, []).append(r)
def med(xs):
    return statistics.median(xs) if xs else float("nan")
print(f"{'row':24} {'window':>6} {'msg/s median':>12} {'min-max':>17} {'server us/msg':>13} {'client us/msg':>13} n")
for (label, w), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    tp = [r["msgs_per_s"] for r in rs]
    s = [r["extra"]["broker_cpu_s"] * 1e6 / r["completed"] for r in rs if "broker_cpu_s" in r.get("extra", {})]
    c = [r["extra"]["client_cpu_s"] * 1e6 / r["completed"] for r in rs if "client_cpu_s" in r.get("extra", {})]
    print(f"{label:24} {w:>6} {med(tp):12,.0f} {min(tp):8,.0f}-{max(tp):<8,.0f} {med(s):13.1f} {med(c):13.1f} {len(rs)}")
EOF
