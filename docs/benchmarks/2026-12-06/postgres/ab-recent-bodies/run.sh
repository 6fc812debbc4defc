#!/usr/bin/env bash
# A/B of the PostgreSQL store: before (4548310) and after (pipelined commits,
# recent bodies), alternating per repetition, on one throwaway PostgreSQL.
set -euo pipefail
. "$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)/tools/lib.sh"
cd /work/main
out=${OUT:-/tmp/ab/out}; mkdir -p "$out"; chmod 755 /tmp/ab
url=$(tools/services/pg-local.sh start /tmp/ab/pg 5460)
trap 'kill $(cat /tmp/ab/*/server.job 2>/dev/null) 2>/dev/null || true; tools/services/pg-local.sh stop /tmp/ab/pg' EXIT
for v in before after; do psql "$url" -qc "CREATE DATABASE ab_$v"; done
for v in before after; do
  start_letterbox /tmp/ab/$v /tmp/letterbox-$v --listen 127.0.0.1:0 --console-listen off --store "${url%/postgres}/ab_$v" --node-name ab
done
for v in before after; do
  wait_letterbox /tmp/ab/$v
  eval port_$v=${SERVER_ADDR##*:}
done
LG=/work/target-ab/release/loadgen
rows=(
 "--workload publish-durable --window 1 --count 3000"
 "--workload publish-durable --window 1024 --batch 100 --count 25000"
 "--workload consume-ack --prefetch 1 --ack async --count 3000"
 "--workload consume-ack --prefetch 256 --ack async --count 25000"
 "--workload end-to-end --window 64 --prefetch 256 --count 12500"
)
for rep in 1 2; do
  for row in "${rows[@]}"; do
    for v in before after; do
      eval port=\$port_$v
      echo "== $v rep $rep: $row"
      $LG run --target letterbox --reps 1 --first-rep $rep --out "$out/results.$v.jsonl" $row --max-secs 60 \
        --letterbox-url http://127.0.0.1:$port --letterbox-metrics-url '' --broker-pid "$(cat /tmp/ab/$v/server.pid)" 2>&1 | grep "msg/s\|error" || true
    done
  done
done
