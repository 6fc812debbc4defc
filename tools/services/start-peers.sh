#!/usr/bin/env bash
# loadgen: start the peer brokers (RabbitMQ, NATS JetStream) that tools/bench/bench.sh
# measures next to Letterbox, bound to loopback only, with all
# state under $QBENCH_PEER_DIR (default /tmp/qbench-peers). Not system
# services: plain background processes whose PIDs are written to
# $QBENCH_PEER_DIR/*.pid so that stop-peers.sh kills exactly those.
#
# usage: start-peers.sh [rabbitmq] [nats]      (default: both)
#
# Env:
#   QBENCH_PEER_DIR   state root (default /tmp/qbench-peers)
#   QBENCH_FRESH=1    wipe broker data before starting (default 1)
#   AMQP_PORT (5672), NATS_PORT (4222), EPMD_PORT (4369), RABBIT_DIST_PORT (25672)
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

ROOT=${QBENCH_PEER_DIR:-/tmp/qbench-peers}
FRESH=${QBENCH_FRESH:-1}
AMQP_PORT=${AMQP_PORT:-5672}
NATS_PORT=${NATS_PORT:-4222}
EPMD_PORT=${EPMD_PORT:-4369}
RABBIT_DIST_PORT=${RABBIT_DIST_PORT:-25672}

which=("$@")
[ ${#which[@]} -eq 0 ] && which=(rabbitmq nats)

mkdir -p "$ROOT"

start_rabbitmq() ( # subshell: the exports below stay local
  R=$ROOT/rabbitmq
  if pidfile_alive "$R/server.pid"; then echo "rabbitmq already running (pid $(cat "$R/server.pid"))"; return; fi
  [ "$FRESH" = 1 ] && rm -rf "$R"
  mkdir -p "$R/mnesia" "$R/log" "$R/home"
  cat > "$R/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
log.console = false
log.file.level = warning
# defaults kept for everything that affects durability/perf:
#   quorum queues: Ra WAL fsync before confirm (wal_sync_method = datasync)
#   classic queues: v1 index + msg store, confirm after fsync of persistent msgs
EOF
  echo "[]." > "$R/enabled_plugins"
  : > "$R/rabbitmq-env.conf"
  # The Erlang cookie goes to $HOME; keep it under $R.
  export HOME="$R/home"
  export RABBITMQ_CONF_ENV_FILE="$R/rabbitmq-env.conf"
  export RABBITMQ_NODENAME=loadgen@localhost
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$AMQP_PORT
  export RABBITMQ_DIST_PORT=$RABBIT_DIST_PORT
  export RABBITMQ_MNESIA_BASE="$R/mnesia"
  export RABBITMQ_LOG_BASE="$R/log"
  export RABBITMQ_CONFIG_FILE="$R/rabbitmq.conf"
  export RABBITMQ_ENABLED_PLUGINS_FILE="$R/enabled_plugins"
  export RABBITMQ_PID_FILE="$R/beam.pid"
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_EPMD_ADDRESS=127.0.0.1
  export ERL_EPMD_PORT=$EPMD_PORT
  export ERL_CRASH_DUMP="$R/log/erl_crash.dump"
  # Our own epmd (loopback only, foreground process so we know its PID).
  if ! pidfile_alive "$R/epmd.pid"; then
    if port_open "$EPMD_PORT"; then
      echo "note: an epmd is already listening on $EPMD_PORT; using it (not ours, will not stop it)"
    else
      setsid epmd -address 127.0.0.1 -port "$EPMD_PORT" > "$R/log/epmd.log" 2>&1 < /dev/null &
      echo $! > "$R/epmd.pid"
      wait_port "$EPMD_PORT" 10 || { echo "epmd did not start"; exit 1; }
    fi
  fi
  setsid /usr/lib/rabbitmq/bin/rabbitmq-server > "$R/log/stdout.log" 2>&1 < /dev/null &
  echo $! > "$R/server.pid"
  if ! wait_port "$AMQP_PORT" 90; then
    echo "rabbitmq did not open 127.0.0.1:$AMQP_PORT in 90s; see $R/log" >&2
    tail -30 "$R/log/stdout.log" >&2 || true
    exit 1
  fi
  echo "rabbitmq $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null) up: amqp://127.0.0.1:$AMQP_PORT (script pid $(cat "$R/server.pid"), data $R/mnesia)"
)

start_nats() {
  local N=$ROOT/nats
  if pidfile_alive "$N/server.pid"; then echo "nats already running (pid $(cat "$N/server.pid"))"; return; fi
  [ "$FRESH" = 1 ] && rm -rf "$N"
  mkdir -p "$N/js"
  # NATS 2.9.x: no sync_interval option (added in 2.10.0); the file store is
  # fsynced by a background timer (2 min for streams in 2.9.10).
  # QBENCH_NATS_SYNC=always (or a duration) sets jetstream.sync_interval (2.10+ only).
  local sync_line=""
  [ -n "${QBENCH_NATS_SYNC:-}" ] && sync_line="  sync_interval: ${QBENCH_NATS_SYNC}"
  cat > "$N/nats.conf" <<EOF
listen: 127.0.0.1:$NATS_PORT
jetstream {
  store_dir: "$N/js"
$sync_line
}
EOF
  setsid nats-server -c "$N/nats.conf" > "$N/nats.log" 2>&1 < /dev/null &
  echo $! > "$N/server.pid"
  if ! wait_port "$NATS_PORT" 30; then
    echo "nats did not open 127.0.0.1:$NATS_PORT; see $N/nats.log" >&2
    tail -30 "$N/nats.log" >&2 || true
    exit 1
  fi
  echo "nats-server $(nats-server --version | awk '{print $2}') up: nats://127.0.0.1:$NATS_PORT (pid $(cat "$N/server.pid"), store $N/js)"
}

for w in "${which[@]}"; do
  case "$w" in
    rabbitmq|rabbit) start_rabbitmq ;;
    nats) start_nats ;;
    *) echo "unknown peer: $w" >&2; exit 2 ;;
  esac
done
