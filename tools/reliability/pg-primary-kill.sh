#!/usr/bin/env bash
# kill -9 of the PostgreSQL primary under a serving Letterbox: starts a
# 3-node Patroni + 3-member etcd cluster on loopback
# (tools/services/patroni-cluster.sh), one Letterbox owner on it (`serve --store`,
# lease LEASE), a publisher of numbered messages (one CLI call each, one
# message, its own id), kills the leader's Patroni and postmaster KILL_AT
# seconds in, and publishes until SECS. The owner is expected to stop with
# exit code 3 (fail-stop: a commit meets the lost connection; README,
# "High availability": the standby, or a restart, takes over); it is then
# started again under the same node name, as its systemd unit would, on
# the new primary. Then the queue is drained: every acknowledged message
# must be there once and nothing else (a publish that failed may be there,
# once). Prints one line of figures: publishes
# acknowledged and failed, the longest time without an acknowledgement,
# the owner's exit. Exits non-zero when a check fails.
#
#   cargo build --bin letterbox
#   tools/reliability/pg-primary-kill.sh
#
# Env: SECS (40), KILL_AT (8), LEASE (10s),
# LETTERBOX (the binary, target/debug/letterbox), DIR (scratch).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

SECS=${SECS:-40}
KILL_AT=${KILL_AT:-8}
LEASE=${LEASE:-10s}
LB=${LETTERBOX:-$TARGET_DIR/debug/letterbox}
DIR=${DIR:-$(mktemp -d /tmp/letterbox-pgkill.XXXXXX)}
cluster=$TOOLS_DIR/services/patroni-cluster.sh
server=

cleanup() {
    [ -z "$server" ] || kill_pid "$server"
    "$cluster" stop "$DIR" || true
    rm -rf "$DIR"
}
trap cleanup EXIT

"$cluster" start "$DIR" > /dev/null
url=$("$cluster" url "$DIR")
port=$(free_port)
addr=http://127.0.0.1:$port
serve() { # directory of its output and log
    start_letterbox "$1" "$LB" --store "$url" --node-name a --lease-ttl "$LEASE" \
        --listen "127.0.0.1:$port"
    server=$SERVER_JOB
    wait_letterbox "$1" 30
}
serve "$DIR/server"
export LETTERBOX_SERVER=$addr
"$LB" queue create q > /dev/null

now() { date +%s.%N; }
start=$(now)
(
    i=0
    while (($(echo "$(now) - $start < $SECS" | bc))); do
        i=$((i + 1))
        t=$(now)
        if timeout 120 "$LB" publish --id "m$i" q "m$i" > /dev/null 2>> "$DIR/publish.err"; then
            echo "ok m$i $t $(now)"
        else
            echo "failed m$i $t $(now)"
        fi
    done
) > "$DIR/publishes" &
publisher=$!
sleep "$KILL_AT"
echo "kill -9 of the leader: $("$cluster" kill-leader "$DIR")" >&2
wait $publisher

alive=yes
pid_alive "$server" || alive=no
status=0
if [ $alive = no ]; then
    wait "$server" || status=$?
    server=
    serve "$DIR/server-again"
fi
"$LB" consume q --json --wait 2s --max 100 > "$DIR/consumed" 2>> "$DIR/consume.err" || true

python3 - "$DIR" "$alive" "$status" "$LEASE" << 'EOF'
import json, sys
d, alive, status, lease = sys.argv[1:]
ok, failed, done_ok = set(), set(), []
for line in open(f"{d}/publishes"):
    kind, mid, t0, t1 = line.split()
    (ok if kind == "ok" else failed).add(mid)
    if kind == "ok":
        done_ok.append(float(t1))
done_ok.sort()
gap = max((b - a for a, b in zip(done_ok, done_ok[1:])), default=0.0)
problems = []
seen = {}
for line in open(f"{d}/consumed"):
    line = line.strip()
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    mid = m.get("message_id") or m.get("id")
    seen[mid] = seen.get(mid, 0) + 1
for mid in ok:
    if seen.get(mid, 0) != 1:
        problems.append(f"{mid} acknowledged, delivered {seen.get(mid, 0)} times")
for mid, n in seen.items():
    if mid not in ok and mid not in failed:
        problems.append(f"{mid} delivered, never published")
    elif mid in failed and n > 1:
        problems.append(f"{mid} (failed publish) delivered {n} times")
if alive == "yes":
    problems.append("the owner was expected to stop and still runs")
elif status != "3":
    problems.append(f"the owner stopped with exit {status}, not 3")
print(json.dumps({
    "lease": lease, "acknowledged": len(ok), "failed": len(failed),
    "longest_gap_s": round(gap, 2),
    "owner_survived": alive == "yes", "exit": None if alive == "yes" else int(status),
    "problems": problems[:10],
}))
sys.exit(1 if problems else 0)
EOF
