#!/usr/bin/env bash
# The chaos run with the server on the PostgreSQL store (serve --store): a
# throwaway PostgreSQL on loopback (tools/services/pg-local.sh), the seeded workload
# and its history checker, every invariant checked over the whole run
# (RELIABILITY.md). The kill point classes are those that do not need the
# local log's file-system calls.
#
# MODE restart (the default): one server, killed with SIGKILL (or
# stopped) at random points and started again, taking its lease back;
# and, when this script started the PostgreSQL (PG_LOCAL_DIR), the class
# db-crash: PostgreSQL stopped at once under the serving server
# (`pg-local.sh stop`, no checkpoint: its crash recovery at the next
# start), up to 1.5 s down, started again; the server stops with exit
# code 3 (fail-stop) and the next epoch starts it again.
# MODE takeover: two nodes on the same database (chaos --pair), both
# --standby with a 2 s lease; each cycle ends the node that owns the
# lease, the other takes over, the ended node starts again as the new
# standby; the workload lists both nodes (the Rust client's failover).
#
# Usage: tools/reliability/chaos-postgres.sh [SEED] [CYCLES] [MODE] [CHAOS FLAGS...]
#        (default 1, 16, restart; e.g. --history FILE after MODE)
# Needs target/debug/chaos and target/debug/letterbox (cargo build --workspace --bins).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
cd "$REPO_ROOT"
pg_local=tools/services/pg-local.sh
[ -n "${PG_LOCAL_URL:-}" ] || exec "$pg_local" run tools/reliability/chaos-postgres.sh "$@"
seed=${1:-1}
cycles=${2:-16}
mode=${3:-restart}
shift $(( $# < 3 ? $# : 3 ))
bin=$TARGET_DIR/debug
classes=random,startup,storm,shutdown,graceful
case "$mode" in
  restart)
    nodes=(--server-arg=--node-name --server-arg=chaos)
    if [ -n "${PG_LOCAL_DIR:-}" ]; then
      classes=$classes,db-crash
      nodes+=(--db-crash-cmd "$pg_local stop $PG_LOCAL_DIR"
              --db-up-cmd "$pg_local up $PG_LOCAL_DIR")
    fi
    ;;
  takeover) nodes=(--pair --server-arg=--lease-ttl --server-arg=2s) ;;
  *) echo "usage: $0 [SEED] [CYCLES] [restart|takeover]" >&2; exit 2 ;;
esac
admin=$PG_LOCAL_URL
psql "$admin" -qc "CREATE DATABASE chaos"
url="${admin%/postgres}/chaos"
"$bin/chaos" --seed "$seed" --cycles "$cycles" --min-hits 1 \
    --classes "$classes" --no-verify \
    --server-bin "$bin/letterbox" \
    --server-arg=--store --server-arg="$url" "${nodes[@]}" "$@"
