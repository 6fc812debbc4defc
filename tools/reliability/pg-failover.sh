#!/usr/bin/env bash
# kill -9 of the PostgreSQL primary under Letterbox's PostgreSQL state:
# starts a 3-node Patroni + 3-member etcd cluster on loopback
# (tools/services/patroni-cluster.sh), runs `pg-failover` (tools/src/bin/pg-failover.rs)
# against it, kills the leader's Patroni and postmaster KILL_AT seconds in,
# and prints pg-failover's JSON line (it exits non-zero when an acknowledged
# batch is missing or an unacknowledged one appears). The cluster is stopped
# and its directory removed on the way out.
#
#   cargo build -p letterbox-tools --bin pg-failover
#   tools/reliability/pg-failover.sh
#
# Env: SECS (writing time, 40), KILL_AT (seconds, 8), PG_FAILOVER (the
# binary, target/debug/pg-failover), DIR (scratch, a new temp directory),
# CONTROL=1 (negative control: the writer deletes one acknowledged key
# before the read-back, and this script must then fail).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

SECS=${SECS:-40}
KILL_AT=${KILL_AT:-8}
PG_FAILOVER=${PG_FAILOVER:-$TARGET_DIR/debug/pg-failover}
DIR=${DIR:-$(mktemp -d /tmp/letterbox-patroni.XXXXXX)}
cluster=$TOOLS_DIR/services/patroni-cluster.sh

cleanup() {
    "$cluster" stop "$DIR" || true
    rm -rf "$DIR"
}
trap cleanup EXIT

started=$(date +%s.%N)
"$cluster" start "$DIR"
echo "cluster up in $(echo "$(date +%s.%N) - $started" | bc) s:"
"$cluster" status "$DIR"

url=$("$cluster" url "$DIR")
control=()
[ "${CONTROL:-0}" = 1 ] && control=(--control-lose-one)
"$PG_FAILOVER" --url "$url" --secs "$SECS" "${control[@]}" > "$DIR/result.json" 2> "$DIR/writer.log" &
writer=$!
sleep "$KILL_AT"
echo "kill -9 of the leader: $("$cluster" kill-leader "$DIR")"
set +e
wait $writer
rc=$?
set -e
echo "after the failover:"
"$cluster" status "$DIR" || true
echo "writer's errors (first 10):"
head -10 "$DIR/writer.log"
cat "$DIR/result.json"
exit $rc
