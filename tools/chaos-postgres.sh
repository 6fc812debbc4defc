#!/usr/bin/env bash
# The chaos run with the server on the PostgreSQL store (serve --store): a
# throwaway PostgreSQL on loopback (tools/pg-local.sh), the seeded workload
# and its history checker, and the server killed with SIGKILL (or stopped)
# at random points and started again, taking its lease back, every
# invariant checked over the whole run (RELIABILITY.md). The kill point
# classes are those that do not need the local log's file-system calls.
#
# Usage: tools/chaos-postgres.sh [SEED] [CYCLES]   (default 1 and 16)
# Needs target/debug/chaos and target/debug/letterbox (cargo build --workspace --bins).
set -euo pipefail
cd "$(dirname "$0")/.."
seed=${1:-1}
cycles=${2:-16}
bin=${CARGO_TARGET_DIR:-target}/debug
[ -n "${PG_LOCAL_URL:-}" ] || exec tools/pg-local.sh run tools/chaos-postgres.sh "$@"
admin=$PG_LOCAL_URL
psql "$admin" -qc "CREATE DATABASE chaos"
url="${admin%/postgres}/chaos"
"$bin/chaos" --seed "$seed" --cycles "$cycles" --min-hits 1 \
    --classes random,startup,storm,shutdown,graceful --no-verify \
    --server-bin "$bin/letterbox" \
    --server-arg=--store --server-arg="$url" --server-arg=--node-name --server-arg=chaos
