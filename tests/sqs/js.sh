#!/usr/bin/env bash
# The SQS endpoint with JavaScript clients from npm: the AWS SDK for
# JavaScript v3 (@aws-sdk/client-sqs) and sqs-consumer through the
# dead-letter flow and a FIFO flow (tests/sqs/js/test.mjs), and the
# README's JavaScript block as printed (tests/sqs/readme.sh).
#
#   bash tests/sqs/js.sh
#
# The packages of tests/sqs/js/package-lock.json are installed with
# `npm ci` into target/sqs-js (never committed), where the test is copied
# to run. Skips (exit 77, tests/common.sh) when node or npm is missing or
# the npm registry does not answer.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. tests/common.sh
. tests/sqs/readme.sh

dir=target/sqs-js
mkdir -p "$dir"
cp tests/sqs/js/package.json tests/sqs/js/package-lock.json tests/sqs/js/test.mjs "$dir/"
npm_install "$dir" ci
test_server

data="$(mktemp -d)"
pid=
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$data"
}
trap cleanup EXIT

"$server" serve --data-dir "$data/db" --listen 127.0.0.1:0 --console-listen off \
  --sqs-listen 127.0.0.1:0 >"$data/out" 2>"$data/log" &
pid=$!
sqs=
for _ in $(seq 200); do
  sqs="$(sed -n 's/^letterbox sqs at //p' "$data/out")"
  [[ -n "$sqs" ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$data/log" >&2; exit 1; }
  sleep 0.05
done
[[ -n "$sqs" ]] || { echo "the server did not announce its SQS endpoint" >&2; exit 1; }

log "@aws-sdk/client-sqs and sqs-consumer against $("$server" --version 2>/dev/null || echo letterbox)"
LETTERBOX_SQS_URL="$sqs" node "$dir/test.mjs"
log "the README's JavaScript block, as printed"
readme_check js "$dir/readme.mjs" "$sqs" node
kill "$pid"
wait "$pid" || true
pid=
