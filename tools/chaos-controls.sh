#!/usr/bin/env bash
# Negative controls of the crash tests: builds `letterbox` six times, each
# with one rule broken on purpose (cargo features of the main crate), and
# shows that the power-loss chaos run catches each one:
#
#   fault-ack-before-fsync   answers before its fdatasync      -> I1, I4 or I12
#                            (left to the next group commit)
#                                                                 (an acknowledged
#                                                                 publish, ack or
#                                                                 create lost)
#   fault-no-delivery-count  delivery count kept in memory     -> I5 (counts)
#   fault-dlq-two-steps      DLQ move as two transactions      -> I6 (two queues)
#   fault-exchange-two-steps exchange publish as two           -> I17 (part of a
#                            transactions                         call stored)
#   fault-no-fifo-release    a failed FIFO message does not    -> I9 (a later
#                            release the later ones of its        message acked
#                            group leased with it                 first)
#   fault-no-log-continuity  starts without checking that the  -> I1 (acknowledged
#                            log goes on where the checkpoint     publishes lost;
#                            says (damage mode: segments          also I4, I5, I13...)
#                            deleted, zeroed, truncated)
#
# A control that is not caught fails the script: the harness would lack
# teeth. The default build is restored at the end.
#
#   tools/chaos-controls.sh                 # as CI runs it
#   CYCLES=40 SEED=9 tools/chaos-controls.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CYCLES=${CYCLES:-15}
SEED=${SEED:-1}
out=target/faults
mkdir -p "$out"
for f in fault-ack-before-fsync fault-no-delivery-count fault-dlq-two-steps fault-exchange-two-steps \
  fault-no-fifo-release fault-no-log-continuity; do
  cargo build --quiet --bin letterbox --features "$f"
  cp target/debug/letterbox "$out/letterbox-$f"
done
cargo build --quiet --bin letterbox
cargo build --quiet -p letterbox-tools --bin chaos
chaos=target/debug/chaos

run() { # fault, invariant, extra args...
  local f=$1 inv=$2
  shift 2
  echo "== negative control $f: expecting violations of $inv"
  "$chaos" --seed "$SEED" --cycles "$CYCLES" --power-loss --no-verify \
    --server-bin "$out/letterbox-$f" --expect-violation "$inv" "$@" |
    grep -E "^(chaos:|kill points|damage|power cuts|I[0-9]+ )"
}

# The answered batch stays unsynced until the next group commit: a power
# cut at a random time or at that fdatasync loses it.
run fault-ack-before-fsync I1,I4,I12 --classes sys:fdatasync,random
run fault-no-delivery-count I5
# The move's window is one fsync plus 100 ms: more poison messages (so more
# moves), kills while serving and more cycles make a short run hit it.
CYCLES=$((CYCLES * 2)) run fault-dlq-two-steps I6 --poison-percent 30 --classes random,sys:fdatasync
# The window is the 100 ms between the two transactions of a call whose
# messages go to both bound queues (about one producer call in twenty).
CYCLES=$((CYCLES * 2)) run fault-exchange-two-steps I17 --classes random,sys:fdatasync
# Not a durability fault: every run has FIFO batches with several messages
# of a group whose first is nacked (flaky, poison) and the rest then acked
# (hundreds of violations in 15 cycles, seeds 1-4).
run fault-no-fifo-release I9
# Damage mode (docs/reliability/chaos.md, "Damage mode"): between cycles a log segment
# is deleted, zeroed or truncated; this build starts on it instead of
# refusing, and what the damaged segment held after the checkpoint is gone.
run fault-no-log-continuity I1,I4 --damage
echo "== all negative controls caught"
