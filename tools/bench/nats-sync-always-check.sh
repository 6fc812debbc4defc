#!/usr/bin/env bash
# loadgen: does the installed nats-server accept `jetstream { sync_interval: always }`
# (fsync before every PubAck)? Prints "supported ..." or "unsupported ...".
# Uses `nats-server -t -c FILE` (test the config and exit): nothing keeps running.
set -uo pipefail
ROOT=${QBENCH_PEER_DIR:-/tmp/qbench-peers}
dir=$ROOT/nats-sync-check
mkdir -p "$dir"
printf 'listen: 127.0.0.1:14222\njetstream { store_dir: "%s/js", sync_interval: always }\n' "$dir" > "$dir/nats.conf"
if msg=$(timeout 10 nats-server -t -c "$dir/nats.conf" 2>&1); then
  echo "supported ($(nats-server --version)): $msg"
else
  echo "unsupported ($(nats-server --version)): $(echo "$msg" | head -3 | tr '\n' ' ')"
fi
rm -rf "$dir"
