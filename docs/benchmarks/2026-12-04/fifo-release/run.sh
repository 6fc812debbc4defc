#!/usr/bin/env bash
# FIFO row before/after: the same loadgen against two server builds,
# alternating, each run on a fresh data directory.
set -euo pipefail
. "$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)/tools/lib.sh"
LG=/work/main/target/release/loadgen
OUT=/tmp/fifo-bench/results.jsonl
mkdir -p /tmp/fifo-bench
: > "$OUT"
run_one() { # label binary consumer rep
  local label=$1 bin=$2 consumer=$3 rep=$4
  local dir=/tmp/fifo-bench/data-$label
  rm -rf "$dir"
  serve_letterbox "/tmp/fifo-bench/server-$label" "$bin" --data-dir "$dir" --listen 127.0.0.1:0
  "$LG" run --target letterbox --workload fifo --groups 10000 --per-group 100 --consumers 8 \
    --prefetch 256 --max-secs 300 --consumer "$consumer" --letterbox-url "$SERVER_URL" \
    --reps 1 --first-rep "$rep" --label "$label" --out "$OUT" > /tmp/fifo-bench/loadgen-$label-$consumer-$rep.log 2>&1
  stop_pid "$SERVER_PID"
  rm -rf "$dir"
}
for rep in 1 2 3; do
  for consumer in receive subscribe; do
    run_one before /tmp/base-target/release/letterbox $consumer $rep
    run_one after /work/main/target/release/letterbox $consumer $rep
  done
done
echo done
