#!/usr/bin/env bash
# loadgen: stop the peers started by start-peers.sh: only the PIDs recorded in
# $QBENCH_PEER_DIR/*/*.pid are signalled (TERM, then KILL after a grace period).
# usage: stop-peers.sh [rabbitmq] [nats] [--wipe]   (default: both; --wipe removes $QBENCH_PEER_DIR)
set -uo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
ROOT=${QBENCH_PEER_DIR:-/tmp/qbench-peers}
wipe=0; which=()
for a in "$@"; do case "$a" in --wipe) wipe=1 ;; *) which+=("$a") ;; esac; done
[ ${#which[@]} -eq 0 ] && which=(rabbitmq nats)

for w in "${which[@]}"; do
  case "$w" in
    rabbitmq|rabbit)
      R=$ROOT/rabbitmq
      stop_pidfile "$R/server.pid" 60 "rabbitmq-server script"
      stop_pidfile "$R/beam.pid" 30 "rabbitmq beam.smp"   # normally gone already
      stop_pidfile "$R/epmd.pid" 10 epmd
      ;;
    nats) stop_pidfile "$ROOT/nats/server.pid" 30 nats-server ;;
    *) echo "unknown peer: $w" >&2; exit 2 ;;
  esac
done
if [ $wipe = 1 ]; then rm -rf "$ROOT"; echo "removed $ROOT"; fi
