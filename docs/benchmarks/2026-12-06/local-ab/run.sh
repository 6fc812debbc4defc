#!/usr/bin/env bash
# A/B of the local store: the release builds named in VARIANTS (each
# $BINDIR/letterbox-$v), alternating within every row and repetition; each
# run on a server started for it on a fresh data directory (so that no
# applier of an earlier run is still at work), stopped after it. Run from
# the repository's root.
set -euo pipefail
. "$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)/tools/lib.sh"
W=${W:-/tmp/local-ab}
BINDIR=${BINDIR:?the directory of the letterbox-VARIANT binaries}
LG=${LG:-target/release/loadgen}
VARIANTS=${VARIANTS:-"old new"}
REPS=${REPS:-3}
out=${OUT:-$W/out}; mkdir -p "$out" "$W"
rows=(
 "--workload publish-durable --window 1 --count 6000"
 "--workload publish-durable --window 64 --count 100000"
 "--workload publish-durable --window 1024 --count 100000"
 "--workload publish-durable --window 1024 --batch 100 --count 200000"
 "--workload consume-ack --prefetch 1 --ack async --count 6000"
 "--workload consume-ack --prefetch 256 --ack async --count 100000"
 "--workload end-to-end --window 64 --prefetch 256 --count 50000"
)
pid=
trap '[ -z "$pid" ] || stop_pid "$pid"' EXIT
for rep in $(seq 1 "$REPS"); do
  for row in "${rows[@]}"; do
    for v in $VARIANTS; do
      rm -rf "$W/data"
      serve_letterbox "$W/$v" "$BINDIR/letterbox-$v" --listen 127.0.0.1:0 --console-listen off \
        --data-dir "$W/data"
      pid=$SERVER_PID
      echo "== $v rep $rep: $row"
      $LG run --target letterbox --reps 1 --first-rep "$rep" --out "$out/results.$v.jsonl" $row --max-secs 60 \
        --letterbox-url "$SERVER_URL" --letterbox-metrics-url '' \
        --broker-pid "$pid" 2>&1 | grep "msg/s\|error" || true
      stop_pid "$pid"; pid=
    done
  done
done
