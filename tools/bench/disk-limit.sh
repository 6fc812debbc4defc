#!/usr/bin/env bash
# loadgen: physical limits of the disk that holds the broker data (/tmp by default):
#   fsync-append-{4k,64k,1m}: sequential appends to a new file, fdatasync after
#       every write (QD1) -> fsyncs/s and fdatasync latency. 4k ~ one 1 KiB
#       message per fsync (window 1); 64k / 1m ~ group commit of 64 / 1024 msgs.
#   fsync-overwrite-4k: same, but rewriting an already written file (no block
#       allocation / size change to journal) -> best case per-fsync cost.
#   seqwrite-direct-1m: O_DIRECT 1 MiB sequential writes, QD4 -> bandwidth.
# usage: disk-limit.sh OUTDIR     (writes one fio JSON per job into OUTDIR)
# Env: QBENCH_DISK_DIR (default /tmp/qbench-fio), QBENCH_DISK_SECS (default 20)
set -euo pipefail
OUT=${1:?usage: disk-limit.sh OUTDIR}
DIR=${QBENCH_DISK_DIR:-/tmp/qbench-fio}
SECS=${QBENCH_DISK_SECS:-20}
mkdir -p "$OUT" "$DIR"
command -v fio >/dev/null || { echo "fio not installed (apt-get install -y fio)" >&2; exit 1; }

job() { # name, fio args...
  local name=$1; shift
  rm -f "$DIR/$name.dat"
  echo "+ fio --name=$name --directory=$DIR --filename=$name.dat $* --output-format=json" | tee -a "$OUT/commands.txt"
  fio --name="$name" --directory="$DIR" --filename="$name.dat" "$@" \
      --output-format=json --output="$OUT/$name.json"
  rm -f "$DIR/$name.dat"
}

common=(--rw=write --ioengine=psync --fdatasync=1 --runtime="$SECS")
job fsync-append-4k    "${common[@]}" --bs=4k  --file_append=1 --size=2G
job fsync-append-64k   "${common[@]}" --bs=64k --file_append=1 --size=8G
job fsync-append-1m    "${common[@]}" --bs=1m  --file_append=1 --size=16G
job fsync-overwrite-4k "${common[@]}" --bs=4k  --overwrite=1   --size=256M
job seqwrite-direct-1m --rw=write --bs=1m --direct=1 --ioengine=libaio --iodepth=4 \
    --size=8G --runtime="$SECS"
rmdir "$DIR" 2>/dev/null || true
echo "fio results in $OUT"
