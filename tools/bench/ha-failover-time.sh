#!/usr/bin/env bash
# Failover time of two Letterbox nodes on one PostgreSQL store: node A owns
# the queues, node B waits with --standby; kill -9 of A, then `letterbox
# publish --server http://A,http://B` in a loop until one succeeds. Prints one
# line per trial: the lease TTL and the seconds from the kill to the first
# acknowledged publish (the loop's resolution: one CLI call, a few ms, plus
# its own short retries).
#
#   cargo build --release --bin letterbox -p letterbox
#   tools/bench/ha-failover-time.sh                       # TTLS="10s 2s", 3 trials each
#   PG_URL=postgres://... tools/bench/ha-failover-time.sh # an existing PostgreSQL
#
# Env: TTLS ("10s 2s"), TRIALS (3), LETTERBOX (the binary,
# $CARGO_TARGET_DIR/release/letterbox), PG_URL (default: a throwaway
# tools/services/pg-local.sh PostgreSQL on PG_PORT (5449), stopped on the way out),
# PORT_A (50081), PORT_B (50082), DIR (scratch, a new temp directory).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
TTLS=${TTLS:-"10s 2s"}
TRIALS=${TRIALS:-3}
LETTERBOX=${LETTERBOX:-$TARGET_DIR/release/letterbox}
PORT_A=${PORT_A:-50081}
PORT_B=${PORT_B:-50082}
PG_PORT=${PG_PORT:-5449}
DIR=${DIR:-$(mktemp -d /tmp/letterbox-ha.XXXXXX)}
mkdir -p "$DIR" && chmod 755 "$DIR"  # PostgreSQL runs as its own user

pids=()
own_pg=0
cleanup() {
    kill_pid "${pids[@]}"
    [ "$own_pg" = 1 ] && "$TOOLS_DIR/services/pg-local.sh" stop "$DIR/pg" > /dev/null 2>&1 || true
    rm -rf "$DIR"
}
trap cleanup EXIT

if [ -z "${PG_URL:-}" ]; then
    PG_URL=$("$TOOLS_DIR/services/pg-local.sh" start "$DIR/pg" "$PG_PORT")
    own_pg=1
fi

node() { # name port ttl: a node on the store, standing by while another owns it (pid in $last)
    start_letterbox "$DIR/$1" "$LETTERBOX" --store "$PG_URL" --node-name "$1" --lease-ttl "$3" \
        --standby --listen "127.0.0.1:$2"
    last=$SERVER_JOB
    pids+=("$last")
}

now() { date +%s.%N; }
servers=http://127.0.0.1:$PORT_A,http://127.0.0.1:$PORT_B

for ttl in $TTLS; do
    for trial in $(seq "$TRIALS"); do
        # A first (it takes the lease, once a lease left by an earlier trial lapses), then B
        node "a$trial-$ttl" "$PORT_A" "$ttl"; a=$last
        wait_letterbox "$DIR/a$trial-$ttl"
        node "b$trial-$ttl" "$PORT_B" "$ttl"; b=$last
        "$LETTERBOX" queue create --server "http://127.0.0.1:$PORT_A" ha-failover > /dev/null 2>&1 || true
        "$LETTERBOX" publish --server "$servers" ha-failover before > /dev/null
        sleep 1
        kill -KILL "$a"
        t0=$(now)
        tries=0
        until "$LETTERBOX" publish --server "$servers" ha-failover after > /dev/null 2>&1; do
            tries=$((tries + 1))
            sleep 0.05
        done
        t1=$(now)
        echo "lease_ttl=$ttl trial=$trial failover_s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b - a}') failed_publishes=$tries"
        # B stops too (kill -9: its lease lapses after the TTL; the next A stands by until then)
        kill_pid "$b" "$a"
    done
done
