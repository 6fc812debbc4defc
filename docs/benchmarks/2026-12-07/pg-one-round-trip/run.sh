#!/usr/bin/env bash
# A/B of the PostgreSQL store's commit: the release builds named in
# VARIANTS (each $BINDIR/letterbox-$v), each serving its own database on
# one throwaway PostgreSQL (STORE=pg: tools/services/pg-local.sh) or on one 3-node
# Patroni cluster with a synchronous standby (STORE=patroni:
# tools/services/patroni-cluster.sh), the variants alternating within every row and
# repetition. Run from the repository's root.
set -euo pipefail
. "$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)/tools/lib.sh"
STORE=${STORE:-pg}
W=${W:-/tmp/ab-one-rt-$STORE}
BINDIR=${BINDIR:?the directory of the letterbox-VARIANT binaries}
LG=${LG:-target/release/loadgen}
VARIANTS=${VARIANTS:-"base new"}
REPS=${REPS:-3}
out=${OUT:-$W/out}; mkdir -p "$out" "$W"; chmod 755 "$W"
case "$STORE" in
  pg) url=$(tools/services/pg-local.sh start "$W/pg" 5462); stop_store() { tools/services/pg-local.sh stop "$W/pg"; } ;;
  patroni) tools/services/patroni-cluster.sh start "$W/patroni" >&2; url=$(tools/services/patroni-cluster.sh url "$W/patroni")
           stop_store() { tools/services/patroni-cluster.sh stop "$W/patroni"; } ;;
  *) echo "STORE is pg or patroni" >&2; exit 2 ;;
esac
trap 'for v in $VARIANTS; do kill "$(cat "$W/$v/server.job" 2>/dev/null)" 2>/dev/null || true; done; stop_store' EXIT
db_url() { echo "$url" | sed "s#/postgres\(?\|\$\)#/ab_$1\1#"; }
for v in $VARIANTS; do psql "$url" -qc "CREATE DATABASE ab_$v"; done
for v in $VARIANTS; do
  start_letterbox "$W/$v" "$BINDIR/letterbox-$v" --listen 127.0.0.1:0 --console-listen off \
    --store "$(db_url "$v")" --node-name ab
done
for v in $VARIANTS; do
  wait_letterbox "$W/$v"
  echo "${SERVER_ADDR##*:}" > "$W/$v.port"
done
rows=(
 "--workload publish-durable --window 1 --count 3000"
 "--workload publish-durable --window 64 --count 25000"
 "--workload publish-durable --window 1024 --batch 100 --count 25000"
 "--workload consume-ack --prefetch 1 --ack async --count 3000"
 "--workload consume-ack --prefetch 256 --ack async --count 25000"
 "--workload end-to-end --window 64 --prefetch 256 --count 12500"
)
for rep in $(seq 1 "$REPS"); do
  for row in "${rows[@]}"; do
    for v in $VARIANTS; do
      echo "== $v rep $rep: $row"
      # shellcheck disable=SC2086
      $LG run --target letterbox --reps 1 --first-rep "$rep" --out "$out/results.$v.jsonl" $row --max-secs 60 \
        --letterbox-url "http://127.0.0.1:$(cat "$W/$v.port")" --letterbox-metrics-url '' \
        --broker-pid "$(cat "$W/$v/server.pid")" 2>&1 | grep "msg/s\|error" || true
    done
  done
done
