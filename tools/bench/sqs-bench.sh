#!/usr/bin/env bash
# The SQS endpoint beside gRPC and beside moto's server, in one run: the
# same loadgen workloads, rows interleaved within each repetition, the
# server's CPU per message from each result's `broker_cpu_s`.
#
#   tools/bench/sqs-bench.sh                    # REPS=3 DIV=1
#   REPS=3 OUT=docs/benchmarks/DATE/sqs tools/bench/sqs-bench.sh
#
# Rows (each on gRPC, on Letterbox's SQS endpoint and on moto's server):
#   send-1      one message per call, 1 in flight: unary `Publish`;
#               `SendMessage`
#   send-64     the same, 64 in flight
#   batch-10    10 messages per call, 64 in flight: `Publish` of 10;
#               `SendMessageBatch`
#   recv-1      one at a time, each settle waited for: `Receive` of 1 +
#               unary `Ack`; `ReceiveMessage` of 1 + `DeleteMessage`
#   recv-10     10 per receive, settles batched: `Receive` of up to 10 +
#               `Ack` of up to 1000 tokens; `ReceiveMessage` of 10 +
#               `DeleteMessageBatch` of 10
# Letterbox serves gRPC and SQS from one process and data directory; moto
# (`moto[server]` from PyPI, installed into MOTO_VENV on first run) keeps
# everything in memory and syncs nothing: a reference, not a durable peer.
#
# Variables: REPS (3), DIV (divides every count, 1), MOTO_DIV (divides
# moto's counts again, 10: its receives scan its whole queue, so a deep
# queue slows it down to a few messages a second), ROWS ("send-1 send-64
# batch-10 recv-1 recv-10"), TARGETS ("grpc sqs moto"), SERVER (the
# release letterbox), LOADGEN (the release loadgen), MOTO_VENV
# (target/moto-venv), MOTO_VERSION (5.2.5), OUT (a directory kept for
# results.jsonl, commands.txt, env.txt, summary.txt; default a temporary
# one). Letterbox listens on free ports (port 0, read from its start
# lines); moto on MOTO_PORT (a free one by default).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

HERE=$REPO_ROOT
SERVER=${SERVER:-$TARGET_DIR/release/letterbox}
LOADGEN=${LOADGEN:-$TARGET_DIR/release/loadgen}
REPS=${REPS:-3}
DIV=${DIV:-1}
MOTO_DIV=${MOTO_DIV:-10}
ROWS=${ROWS:-send-1 send-64 batch-10 recv-1 recv-10}
TARGETS=${TARGETS:-grpc sqs moto}
MOTO_VENV=${MOTO_VENV:-$HERE/target/moto-venv}
MOTO_VERSION=${MOTO_VERSION:-5.2.5}
MOTO_PORT=${MOTO_PORT:-$(free_port)}
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    WORK=$OUT
else
    WORK=$(mktemp -d)
fi
DATA=$(mktemp -d)
RESULTS=$WORK/results.jsonl
COMMANDS=$WORK/commands.txt
: > "$RESULTS"
: > "$COMMANDS"

case " $TARGETS " in
*" moto "*)
    if ! "$MOTO_VENV/bin/python" -c "import moto, flask; assert moto.__version__ == '$MOTO_VERSION'" 2>/dev/null; then
        echo "installing moto[server]==$MOTO_VERSION into $MOTO_VENV" >&2
        python3 -m venv "$MOTO_VENV"
        "$MOTO_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            "moto[server]==$MOTO_VERSION"
    fi
    ;;
esac

{
    echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "server: $("$SERVER" --version)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //') x $(nproc)"
    echo "kernel: $(uname -r)"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    [ -x "$MOTO_VENV/bin/python" ] && echo "moto: $("$MOTO_VENV/bin/python" -c 'import moto; print(moto.__version__)')"
    echo "REPS=$REPS DIV=$DIV MOTO_DIV=$MOTO_DIV ROWS=\"$ROWS\" TARGETS=\"$TARGETS\""
} > "$WORK/env.txt"

lb=
moto=
cleanup() {
    [ -z "$lb" ] || stop_pid "$lb" 30 letterbox
    [ -z "$moto" ] || stop_pid "$moto" 10 moto
    rm -rf "$DATA"
    [ -n "${OUT:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT
start_letterbox "$WORK/letterbox" "$SERVER" --data-dir "$DATA/letterbox" \
    --listen 127.0.0.1:0 --sqs-listen 127.0.0.1:0 --console-listen off
wait_letterbox "$WORK/letterbox"
lb=$SERVER_PID
GRPC_URL=$SERVER_URL
SQS_URL=$(announced "$WORK/letterbox" "$LETTERBOX_SQS_LINE")
SQS_URL=${SQS_URL%/}
[ -n "$SQS_URL" ] || { echo "the server announced no SQS endpoint" >&2; exit 1; }
case " $TARGETS " in
*" moto "*)
    setsid "$MOTO_VENV/bin/moto_server" -H 127.0.0.1 -p "$MOTO_PORT" > "$WORK/moto.log" 2>&1 &
    moto=$!
    wait_port "$MOTO_PORT" 30 || { echo "moto did not listen on $MOTO_PORT" >&2; exit 1; }
    ;;
esac

count() { # row target -> messages per run
    local n
    case $1 in
        send-1 | recv-1) n=3000 ;;
        send-64 | recv-10) n=20000 ;;
        batch-10) n=40000 ;;
    esac
    n=$((n / DIV))
    [ "$2" = moto ] && n=$((n / MOTO_DIV))
    echo $n
}

run() { # row target rep
    local row=$1 t=$2 rep=$3 target pid mode=stream args
    case $t in
        grpc) target=letterbox pid=$lb mode=unary ;;
        sqs) target=letterbox-sqs pid=$lb ;;
        moto) target=moto-sqs pid=$moto ;;
        *) echo "unknown target $t" >&2; exit 2 ;;
    esac
    case $row in
        send-1) args="--workload publish-durable --window 1" ;;
        send-64) args="--workload publish-durable --window 64" ;;
        batch-10) args="--workload publish-durable --window 64 --batch 10" ;;
        recv-1) args="--workload consume-ack --prefetch 1 --ack sync" ;;
        recv-10) args="--workload consume-ack --prefetch 10 --ack async" ;;
        *) echo "unknown row $row" >&2; exit 2 ;;
    esac
    local cmd
    cmd="LOADGEN_LETTERBOX_PUBLISH=$mode $LOADGEN run --target $target $args --count $(count "$row" "$t") --max-secs 60 --broker-pid $pid --first-rep $rep --label $row --letterbox-url $GRPC_URL --sqs-url $SQS_URL --moto-url http://127.0.0.1:$MOTO_PORT --out $RESULTS"
    echo "$cmd" >> "$COMMANDS"
    # shellcheck disable=SC2086
    env LOADGEN_LETTERBOX_PUBLISH=$mode "$LOADGEN" run --target "$target" $args \
        --count "$(count "$row" "$t")" --max-secs 60 --broker-pid "$pid" --first-rep "$rep" \
        --label "$row" --letterbox-url "$GRPC_URL" \
        --sqs-url "$SQS_URL" --moto-url "http://127.0.0.1:$MOTO_PORT" \
        --out "$RESULTS" > /dev/null 2>> "$WORK/loadgen.log"
}

for rep in $(seq "$REPS"); do
    for row in $ROWS; do
        for t in $TARGETS; do
            run "$row" "$t" "$rep"
        done
    done
    echo "rep $rep done" >&2
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$WORK/env.txt"

python3 - "$RESULTS" <<'EOF' | tee "$WORK/summary.txt"
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault((r["label"], r["target"]), []).append(r)
def med(xs):
    return statistics.median(xs) if xs else float("nan")
names = {"letterbox": "gRPC", "letterbox-sqs": "SQS", "moto-sqs": "moto"}
cpu = {}
print(f"{'row':9} {'target':5} {'msg/s median':>12} {'min-max':>17} {'server us/msg':>13} {'client us/msg':>13} n")
order = ["send-1", "send-64", "batch-10", "recv-1", "recv-10"]
for (label, target), rs in sorted(rows.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else 99, list(names).index(kv[0][1]) if kv[0][1] in names else 9)):
    tp = [r["msgs_per_s"] for r in rs]
    s = [r["extra"]["broker_cpu_s"] * 1e6 / r["completed"] for r in rs if r["completed"] and "broker_cpu_s" in r.get("extra", {})]
    c = [r["extra"]["client_cpu_s"] * 1e6 / r["completed"] for r in rs if r["completed"] and "client_cpu_s" in r.get("extra", {})]
    cpu[(label, target)] = med(s)
    print(f"{label:9} {names.get(target, target):5} {med(tp):12,.0f} {min(tp):8,.0f}-{max(tp):<8,.0f} {med(s):13.1f} {med(c):13.1f} {len(rs)}")
print()
print("server CPU per message, SQS / gRPC:")
for label in order:
    if (label, "letterbox") in cpu and (label, "letterbox-sqs") in cpu:
        print(f"  {label:9} {cpu[(label, 'letterbox-sqs')] / cpu[(label, 'letterbox')]:.2f}x")
EOF
