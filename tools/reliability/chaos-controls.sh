#!/usr/bin/env bash
# Negative controls of the crash tests: builds `letterbox` once with the
# cargo feature `fault-injection` (src/faults.rs) and shows that the
# power-loss chaos run catches each rule it can break on purpose, chosen
# per run by the environment variable LETTERBOX_FAULT (the chaos tool's
# server inherits its environment):
#
#   ack-before-fsync    answers before its fdatasync      -> I1, I4 or I12
#                       (left to the next group commit)      (an acknowledged
#                                                            publish, ack or
#                                                            create lost)
#   no-delivery-count   delivery count kept in memory     -> I5 (counts)
#   dlq-two-steps       DLQ move as two transactions      -> I6 (two queues)
#   exchange-two-steps  exchange publish as two           -> I17 (part of a
#                       transactions                         call stored)
#   no-fifo-release     a failed FIFO message does not    -> I9 (a later
#                       release the later ones of its        message acked
#                       group leased with it                 first)
#   no-log-continuity   starts without checking that the  -> I1 (acknowledged
#                       log goes on where the checkpoint     publishes lost;
#                       says (damage mode: segments          also I4, I5, I13...)
#                       deleted, zeroed, truncated)
#   no-later-write-scan takes the first place the log's   -> I1 (acknowledged
#                       records stop as its end (damage      publishes lost)
#                       mode: a zeroed page, damaged
#                       records in a row)
#   no-segment-notes    answers records in a segment      -> I1 (acknowledged
#                       before CHECKPOINT lists it (damage   publishes lost), or
#                       mode: the newest segment cut or      I16 (a power cut
#                       zeroed after a switch)               lost a whole
#                                                            segment, and the
#                                                            start refuses the
#                                                            gap it left)
#
# A control that is not caught fails the script: the harness would lack
# teeth. The fault build goes to target/faults/letterbox-faults; cargo
# puts it at target/debug/letterbox on the way, so the default build is
# put back at once, by the same `cargo build --workspace --bins` as
# .ci/run's (nothing to compile when that has just run).
#
#   tools/reliability/chaos-controls.sh                 # as CI runs it
#   CYCLES=40 SEED=9 tools/reliability/chaos-controls.sh
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
cd "$REPO_ROOT"
CYCLES=${CYCLES:-15}
SEED=${SEED:-1}
target=$TARGET_DIR
out=$target/faults
faulty=$out/letterbox-faults
mkdir -p "$out"
started=$SECONDS
# `--workspace` with the feature named through its package: the
# dependencies keep the features of the workspace build, so only letterbox
# itself is compiled again (`cargo build --bin letterbox --features
# fault-injection` resolves the root package alone and compiles tonic, h2,
# tower and the rest a second time).
cargo build --quiet --workspace --bin letterbox --features letterbox/fault-injection
cp "$target/debug/letterbox" "$faulty"
cargo build --quiet --workspace --bins
echo "== built in $((SECONDS - started)) s"
chaos=$target/debug/chaos

# TRIES (1): seeds to try, SEED then SEED+1...: a fault whose window is a
# moment between two transactions is caught only when a kill falls into
# it, so one seed's run can miss it by chance; such a control fails only
# when every seed misses it.
run() { # fault, invariant, extra args...
  local f=$1 inv=$2 t=$SECONDS seed=$SEED i
  shift 2
  echo "== negative control $f: expecting violations of $inv"
  for ((i = 1; ; i++)); do
    if LETTERBOX_FAULT=$f "$chaos" --seed "$seed" --cycles "$CYCLES" --power-loss --no-verify \
      --server-bin "$faulty" --expect-violation "$inv" "$@" |
      grep -E "^(chaos:|kill points|damage|power cuts|I[0-9]+ )"; then
      break
    fi
    if ((i >= ${TRIES:-1})); then
      echo "== $f not caught (seeds $SEED to $seed)"
      return 1
    fi
    seed=$((seed + 1))
    echo "== $f not caught with seed $((seed - 1)): trying seed $seed"
  done
  echo "== $f caught ($((SECONDS - t)) s)"
}

# The answered batch stays unsynced until the next group commit: a power
# cut at a random time or at that fdatasync loses it.
run ack-before-fsync I1,I4,I12 --classes sys:fdatasync,random
run no-delivery-count I5
# The move's window is one fsync plus 100 ms: more poison messages (so more
# moves), kills while serving and more cycles make a short run hit it
# (I6 90 and 70 with seeds 1 and 2, docs/reliability/runs.md).
TRIES=2 CYCLES=$((CYCLES * 2)) run dlq-two-steps I6 --poison-percent 30 --classes random,sys:fdatasync
# The window is the 100 ms between the two transactions of a call whose
# messages go to both bound queues (about one producer call in twenty).
TRIES=2 CYCLES=$((CYCLES * 2)) run exchange-two-steps I17 --classes random,sys:fdatasync
# Not a durability fault: every run has FIFO batches with several messages
# of a group whose first is nacked (flaky, poison) and the rest then acked
# (hundreds of violations in 15 cycles, seeds 1-4).
run no-fifo-release I9
# Damage mode (docs/reliability/chaos.md, "Damage mode"): between cycles a log segment
# is deleted, zeroed or truncated; this build starts on it instead of
# refusing, and what the damaged segment held after the checkpoint is gone.
run no-log-continuity I1,I4 --damage
# Only the kinds that damage records in the middle of the log: this build
# takes the damage for the log's end, and what was written after it is
# gone. And only the kinds that cut or zero the segment the log moved
# into last: this build answered its records before listing it, so the
# start cannot tell. When a power cut takes a whole new segment (its file
# not yet durable) and a later one survives, the look past the log's end
# refuses the start for good: chaos counts that under I16, as a run whose
# final server cannot start.
run no-later-write-scan I1 --damage --damage-kinds zero-page,damage-frames
run no-segment-notes I1,I16 --damage --damage-kinds truncate-new,zero-new
echo "== all negative controls caught ($((SECONDS - started)) s)"
