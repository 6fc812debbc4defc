#!/usr/bin/env bash
# A/B of the PostgreSQL store's consume path: the builds named in VARIANTS
# (each a release binary /work/target-pgperf-base/letterbox-$v), each with its
# own database on one throwaway PostgreSQL, the variants alternating within
# every row and repetition.
set -euo pipefail
. "$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)/tools/lib.sh"
cd /work/wt-pgperf
W=${W:-/tmp/abgm}
VARIANTS=${VARIANTS:-"base new"}
REPS=${REPS:-2}
out=${OUT:-$W/out}; mkdir -p "$out" "$W"; chmod 755 "$W"
url=$(tools/services/pg-local.sh start "$W/pg" 5461)
trap 'for v in $VARIANTS; do kill "$(cat "$W/$v/server.job" 2>/dev/null)" 2>/dev/null || true; done; tools/services/pg-local.sh stop "$W/pg"' EXIT
for v in $VARIANTS; do psql "$url" -qc "CREATE DATABASE ab_$v"; done
for v in $VARIANTS; do
  start_letterbox "$W/$v" /work/target-pgperf-base/letterbox-$v --listen 127.0.0.1:0 --console-listen off \
    --store "${url%/postgres}/ab_$v" --node-name ab
done
for v in $VARIANTS; do
  wait_letterbox "$W/$v"
  echo "${SERVER_ADDR##*:}" > "$W/$v.port"
done
LG=/work/target-pgperf/release/loadgen
rows=(
 "--workload publish-durable --window 1 --count 3000"
 "--workload publish-durable --window 1024 --batch 100 --count 25000"
 "--workload consume-ack --prefetch 1 --ack async --count 3000"
 "--workload consume-ack --prefetch 256 --ack async --count 25000"
 "--workload end-to-end --window 64 --prefetch 256 --count 12500"
)
for rep in $(seq 1 "$REPS"); do
  for row in "${rows[@]}"; do
    for v in $VARIANTS; do
      echo "== $v rep $rep: $row"
      $LG run --target letterbox --reps 1 --first-rep "$rep" --out "$out/results.$v.jsonl" $row --max-secs 60 \
        --letterbox-url "http://127.0.0.1:$(cat "$W/$v.port")" --letterbox-metrics-url '' \
        --broker-pid "$(cat "$W/$v/server.pid")" 2>&1 | grep "msg/s\|error" || true
    done
  done
done
