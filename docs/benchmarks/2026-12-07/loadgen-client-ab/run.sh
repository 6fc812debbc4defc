#!/usr/bin/env bash
# loadgen on raw tonic stubs (built from dc54ea5) against loadgen on the
# client library (e794222 and after), the same release server for both,
# on the rows whose Letterbox side moved to the client library: for each
# row, REPS repetitions of each loadgen in turn, each against a fresh
# server on a fresh data directory. One line per run: the row, the build,
# loadgen's msg/s line, loadgen's own CPU seconds (user + system) and the
# server's.
#
#   docs/benchmarks/2026-12-07/loadgen-client-ab/run.sh OLD_LOADGEN NEW_LOADGEN SERVER > runs.txt
#
# ROW="--workload ..." runs that row alone.
set -euo pipefail
. "$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)/tools/lib.sh"
OLD=$1 NEW=$2 SERVER=$3
REPS=${REPS:-3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SERVE_WRAP=(/usr/bin/time -o "$WORK/server.time" -f "%U %S")
ROWS=(
  "--workload publish-durable --window 1024 --batch 100 --count 200000 --max-secs 60"
  "--workload consume-ack --prefetch 1 --ack async --count 6250 --max-secs 60"
  "--workload consume-ack --prefetch 1 --ack sync --count 6250 --max-secs 60"
  "--workload consume-ack --prefetch 256 --ack async --count 200000 --max-secs 60"
  "--workload end-to-end --window 64 --prefetch 256 --count 100000 --max-secs 60"
)
if [ -n "${ROW:-}" ]; then
  ROWS=("$ROW")
fi
for row in "${ROWS[@]}"; do
  for rep in $(seq "$REPS"); do
    for build in old new; do
      lg=$OLD
      [ $build = new ] && lg=$NEW
      dir=$WORK/data
      rm -rf "$dir"
      serve_letterbox "$WORK" "$SERVER" --data-dir "$dir" --listen 127.0.0.1:0
      # shellcheck disable=SC2086
      out=$(/usr/bin/time -o "$WORK/loadgen.time" -f "%U %S" "$lg" run --target letterbox \
        --letterbox-url "$SERVER_URL" --reps 1 $row 2>&1 |
        grep -v '^{' | grep 'msg/s' | sed 's/.*rep 1\] //')
      kill -TERM "$SERVER_PID"
      wait "$SERVER_JOB" || true
      echo "row [$row] rep $rep build $build | $out | loadgen $(awk '{ printf "%.2f", $1 + $2 }' "$WORK/loadgen.time") s | server $(awk '{ printf "%.2f", $1 + $2 }' "$WORK/server.time") s"
    done
  done
done
