#!/usr/bin/env bash
# loadgen: stop the peers started by start-peers.sh: only the PIDs recorded in
# $QBENCH_PEER_DIR/*/*.pid are signalled (TERM, then KILL after a grace period).
# usage: stop-peers.sh [rabbitmq] [nats] [--wipe]   (default: both; --wipe removes $QBENCH_PEER_DIR)
set -uo pipefail
ROOT=${QBENCH_PEER_DIR:-/tmp/qbench-peers}
wipe=0; which=()
for a in "$@"; do case "$a" in --wipe) wipe=1 ;; *) which+=("$a") ;; esac; done
[ ${#which[@]} -eq 0 ] && which=(rabbitmq nats)

stop_pidfile() { # pidfile label grace_s
  local f=$1 label=$2 grace=${3:-30}
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    local end=$((SECONDS + grace))
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$label (pid $pid) did not exit after ${grace}s; KILL"
      kill -KILL "$pid" 2>/dev/null
    fi
    echo "stopped $label (pid $pid)"
  fi
  rm -f "$f"
}

for w in "${which[@]}"; do
  case "$w" in
    rabbitmq|rabbit)
      R=$ROOT/rabbitmq
      stop_pidfile "$R/server.pid" "rabbitmq-server script" 60
      stop_pidfile "$R/beam.pid" "rabbitmq beam.smp" 30   # normally gone already
      stop_pidfile "$R/epmd.pid" "epmd" 10
      ;;
    nats) stop_pidfile "$ROOT/nats/server.pid" "nats-server" 30 ;;
    *) echo "unknown peer: $w" >&2; exit 2 ;;
  esac
done
if [ $wipe = 1 ]; then rm -rf "$ROOT"; echo "removed $ROOT"; fi
