#!/usr/bin/env bash
# A 3-node RabbitMQ cluster on loopback, for loadgen's `rabbit-quorum-3`
# target (quorum queues with 3 members, the like-for-like peer of
# `letterbox-patroni`). Debian's package (RabbitMQ 3.10):
#
#   apt-get install -y rabbitmq-server
#
# Usage:
#   tools/services/rabbit-cluster.sh start DIR     start lbq1..lbq3@localhost, join lbq2 and lbq3
#                                         to lbq1, wait until lbq1 lists 3 running nodes
#   tools/services/rabbit-cluster.sh url DIR       the AMQP URL of the first node
#   tools/services/rabbit-cluster.sh status DIR    rabbitmqctl cluster_status (of lbq1)
#   tools/services/rabbit-cluster.sh ctl DIR ARGS...     rabbitmqctl ARGS against lbq1
#                                               (e.g. list_queues name type members)
#   tools/services/rabbit-cluster.sh queues DIR ARGS...  rabbitmq-queues ARGS against lbq1
#                                               (e.g. quorum_status loadgen)
#   tools/services/rabbit-cluster.sh pids DIR      the three beam.smp PIDs, one a line
#   tools/services/rabbit-cluster.sh stop DIR      stop exactly what start recorded in DIR
#                                         (a second stop does nothing)
#
# Not system services: plain background processes, everything on
# 127.0.0.1, all state under DIR (DIR/lbqN/{mnesia,log,*.pid}, one shared
# Erlang cookie in DIR/home/.erlang.cookie, one epmd of its own). The
# ports stay clear of start-peers.sh's single node (5672, 25672,
# epmd 4369), so both can run at once:
#
# Env: RABBIT_CLUSTER_AMQP_PORT (5681: the nodes listen on 5681, 5682, 5683),
#      RABBIT_CLUSTER_DIST_PORT (25681: 25681-25683), RABBIT_CLUSTER_EPMD_PORT (4370)
#
# Durability settings are RabbitMQ's defaults: a quorum queue confirms a
# publish once a majority of its members have it in their Ra WAL, fsynced.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

cmd=${1:?usage: $0 start|url|status|ctl|queues|pids|stop DIR [ARGS...]}
dir=${2:?give a scratch directory}
shift 2
[ -d "$dir" ] && dir=$(cd "$dir" && pwd)
AMQP_PORT=${RABBIT_CLUSTER_AMQP_PORT:-5681}
DIST_PORT=${RABBIT_CLUSTER_DIST_PORT:-25681}
EPMD_PORT=${RABBIT_CLUSTER_EPMD_PORT:-4370}
BIN=/usr/lib/rabbitmq/bin
NODES=(1 2 3)


# The environment of node $1 (for its server and for the CLI tools that
# talk to it); call it in a subshell.
node_env() {
  local n=$dir/lbq$1
  export HOME=$dir/home # the Erlang cookie, shared by the three nodes and the CLI
  export RABBITMQ_CONF_ENV_FILE=$n/rabbitmq-env.conf
  export RABBITMQ_NODENAME=lbq$1@localhost
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$((AMQP_PORT + $1 - 1))
  export RABBITMQ_DIST_PORT=$((DIST_PORT + $1 - 1))
  export RABBITMQ_MNESIA_BASE=$n/mnesia
  export RABBITMQ_LOG_BASE=$n/log
  export RABBITMQ_CONFIG_FILE=$n/rabbitmq.conf
  export RABBITMQ_ENABLED_PLUGINS_FILE=$n/enabled_plugins
  export RABBITMQ_PID_FILE=$n/beam.pid
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_EPMD_ADDRESS=127.0.0.1
  export ERL_EPMD_PORT=$EPMD_PORT
  export ERL_CRASH_DUMP=$n/log/erl_crash.dump
}

ctl() { # node rabbitmqctl-args...
  local i=$1
  shift
  (node_env "$i" && "$BIN/rabbitmqctl" -n "lbq$i@localhost" "$@")
}

# The nodes lbq$1 reports as running, one a line.
running_nodes() {
  ctl "$1" cluster_status --formatter json 2>/dev/null |
    python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin).get("running_nodes", [])))' 2>/dev/null
}

start() {
  local i n
  if pidfile_alive "$dir/lbq1/server.pid" || pidfile_alive "$dir/lbq2/server.pid" || pidfile_alive "$dir/lbq3/server.pid"; then
    for i in "${NODES[@]}"; do
      pidfile_alive "$dir/lbq$i/server.pid" || { echo "rabbit-cluster: $dir is partly running; stop it first" >&2; exit 1; }
    done
    echo "rabbit-cluster: already running in $dir"
  else
    for i in "${NODES[@]}"; do
      if port_open $((AMQP_PORT + i - 1)); then
        echo "something else listens on 127.0.0.1:$((AMQP_PORT + i - 1)); stop it or set RABBIT_CLUSTER_AMQP_PORT" >&2
        exit 1
      fi
    done
    mkdir -p "$dir/home"
    dir=$(cd "$dir" && pwd)
    # One cookie for the three nodes and the CLI tools (all with HOME=$dir/home).
    if [ ! -s "$dir/home/.erlang.cookie" ]; then
      head -c 15 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F > "$dir/home/.erlang.cookie"
      chmod 400 "$dir/home/.erlang.cookie"
    fi
    if ! pidfile_alive "$dir/epmd.pid"; then
      if port_open "$EPMD_PORT"; then
        echo "note: an epmd is already listening on $EPMD_PORT; using it (not ours, will not stop it)"
      else
        setsid epmd -address 127.0.0.1 -port "$EPMD_PORT" > "$dir/epmd.log" 2>&1 < /dev/null &
        echo $! > "$dir/epmd.pid"
        wait_port "$EPMD_PORT" 10 || { echo "epmd did not start on $EPMD_PORT" >&2; exit 1; }
      fi
    fi
    for i in "${NODES[@]}"; do
      n=$dir/lbq$i
      mkdir -p "$n/mnesia" "$n/log"
      cat > "$n/rabbitmq.conf" <<EOF
listeners.tcp.default = 127.0.0.1:$((AMQP_PORT + i - 1))
log.console = false
log.file.level = warning
# defaults kept for everything that affects durability/perf:
#   quorum queues: confirm once a majority of the members have the
#   command in their Ra WAL, fsynced (wal_sync_method = datasync)
EOF
      echo "[]." > "$n/enabled_plugins"
      : > "$n/rabbitmq-env.conf"
    done
    # All three at once: after a stop, a node with data waits for its
    # peers (Mnesia) before it opens its port.
    for i in "${NODES[@]}"; do
      n=$dir/lbq$i
      (node_env "$i" && exec setsid "$BIN/rabbitmq-server" > "$n/log/stdout.log" 2>&1 < /dev/null) &
      echo $! > "$n/server.pid"
    done
    for i in "${NODES[@]}"; do
      if ! wait_port $((AMQP_PORT + i - 1)) 180; then
        echo "lbq$i did not open 127.0.0.1:$((AMQP_PORT + i - 1)) in 180 s; see $dir/lbq$i/log" >&2
        tail -30 "$dir/lbq$i/log/stdout.log" >&2 || true
        exit 1
      fi
    done
  fi

  # Join lbq2 and lbq3 to lbq1 (those not in its cluster yet).
  local st
  for i in 2 3; do
    st=$(ctl "$i" cluster_status --formatter json 2>/dev/null || true)
    if ! grep -q '"lbq1@localhost"' <<< "$st"; then
      ctl "$i" stop_app > /dev/null
      ctl "$i" join_cluster lbq1@localhost > /dev/null
      ctl "$i" start_app > /dev/null
    fi
  done
  local waited=0 running
  until running=$(running_nodes 1) && [ "$(grep -c '@localhost' <<< "$running")" = 3 ]; do
    sleep 1
    waited=$((waited + 1))
    if [ $waited -gt 120 ]; then
      echo "rabbit-cluster: lbq1 does not list 3 running nodes after 120 s (logs in $dir/lbq*/log):" >&2
      ctl 1 cluster_status >&2 || true
      exit 1
    fi
  done
  echo "amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f" > "$dir/url"
  echo "rabbitmq $(dpkg-query -W -f='${Version}' rabbitmq-server 2>/dev/null) cluster up:" \
    "$(tr '\n' ' ' <<< "$running")(AMQP 127.0.0.1:$AMQP_PORT-$((AMQP_PORT + 2)), beam pids $(pids | tr '\n' ' ')data $dir)"
}

url() {
  if [ -f "$dir/url" ]; then cat "$dir/url"; else echo "amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f"; fi
}

pids() {
  local i
  for i in "${NODES[@]}"; do
    pidfile_alive "$dir/lbq$i/beam.pid" && echo "$(cat "$dir/lbq$i/beam.pid")"
  done
  return 0
}

# Signals the processes of these pid files (TERM, KILL after $1 tenths of a
# second) and removes the files.
stop_pidfiles() {
  local tenths=$1 f pid pids=() files=()
  shift
  for f in "$@"; do
    [ -f "$f" ] || continue
    files+=("$f")
    pid=$(cat "$f")
    pid_alive "$pid" && pids+=("$pid")
  done
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    if ! wait_gone "$tenths" "${pids[@]}"; then
      echo "rabbit-cluster: ${pids[*]} still there after $((tenths / 10)) s; KILL" >&2
      kill -KILL "${pids[@]}" 2>/dev/null || true
    fi
    echo "rabbit-cluster: stopped ${pids[*]}"
  fi
  [ ${#files[@]} -gt 0 ] && rm -f "${files[@]}"
  return 0
}

stop() {
  # The wrapper scripts stop their beam.smp on TERM (gracefully, and wait
  # for it); a beam that is left is stopped by its own pid; epmd last.
  stop_pidfiles 600 "$dir"/lbq{1,2,3}/server.pid
  stop_pidfiles 300 "$dir"/lbq{1,2,3}/beam.pid
  stop_pidfiles 100 "$dir/epmd.pid"
}

case "$cmd" in
  start) start ;;
  url) url ;;
  status) ctl 1 cluster_status "$@" ;;
  ctl) ctl 1 "$@" ;;
  queues) (node_env 1 && "$BIN/rabbitmq-queues" -n lbq1@localhost "$@") ;;
  pids) pids ;;
  stop) stop ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
