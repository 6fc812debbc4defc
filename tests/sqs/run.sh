#!/usr/bin/env bash
# The SQS endpoint with real clients from PyPI (JavaScript's are in
# tests/sqs/js.sh):
#   1. tests/sqs/test_boto3.py: boto3 through the dead-letter flow and a
#      FIFO flow; tests/sqs/test_auth.py: boto3's SigV4 signatures with a
#      principal's access key (made by `letterbox auth new-aws-key`);
#      tests/sqs/test_cli.sh: the AWS CLI through the same flows;
#      tests/sqs/test_crash.py: boto3 across a kill -9 of the server; the
#      README's boto3 and AWS CLI blocks as printed (tests/sqs/readme.sh);
#   2. moto 5.2.5's own SQS tests (tests/test_sqs/test_sqs.py and
#      test_sqs_message_attributes.py from its source distribution on
#      PyPI) in moto's server mode against Letterbox, less the tests of
#      tests/sqs/moto-deselect.txt.
#
#   bash tests/sqs/run.sh
#
# Everything goes under target/ (never committed): target/sqs-venv (the
# virtualenv of tests/sqs/requirements.txt), target/sqs-moto (moto's
# source distribution, unpacked). Skips (exit 77, tests/common.sh) when
# python3 is missing or PyPI does not answer. moto's tests expect their
# server on localhost:5000: that port must be free.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
. tests/common.sh
. tests/sqs/readme.sh

test_venv target/sqs-venv tests/sqs/requirements.txt
test_server

moto_dir=target/sqs-moto/moto-5.2.5
if [[ ! -f "$moto_dir/tests/test_sqs/test_sqs.py" ]]; then
  log "fetching moto 5.2.5's source distribution (its tests)"
  mkdir -p target/sqs-moto
  "$py" -m pip download --disable-pip-version-check --quiet --no-binary moto \
    --no-deps moto==5.2.5 -d target/sqs-moto
  tar -xzf target/sqs-moto/moto-5.2.5.tar.gz -C target/sqs-moto
fi

data="$(mktemp -d)"
out="$data/out"
pid=
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$data"
}
trap cleanup EXIT

# start ARGS...: a server on a fresh data directory; sets pid and sqs.
start() {
  rm -rf "$data/db" && mkdir -p "$data/db"
  start_again "$@"
}

# start_again ARGS...: a server on the data directory as it is.
start_again() {
  : >"$out"
  "$server" serve --data-dir "$data/db" --listen 127.0.0.1:0 \
    --console-listen off "$@" >"$out" 2>"$data/log" &
  pid=$!
  for _ in $(seq 200); do
    sqs="$(sed -n 's/^letterbox sqs at //p' "$out")"
    [[ -n "$sqs" ]] && return
    kill -0 "$pid" 2>/dev/null || { cat "$data/log" >&2; exit 1; }
    sleep 0.05
  done
  echo "the server did not announce its SQS endpoint" >&2
  exit 1
}
stop() { kill "$pid"; wait "$pid" || true; pid=; }

log "boto3 against $("$server" --version 2>/dev/null || echo letterbox)"
start --sqs-listen 127.0.0.1:0
LETTERBOX_SQS_URL="$sqs" "$py" tests/sqs/test_boto3.py
stop

log "the README's boto3 and AWS CLI blocks, as printed"
start --sqs-listen 127.0.0.1:0
readme_check python "$data/readme.py" "$sqs" "$py"
stop
start --sqs-listen 127.0.0.1:0
PATH="$(dirname "$py"):$PATH" readme_check sh "$data/readme.sh" "$sqs" bash
stop

log "the AWS CLI against $("$server" --version 2>/dev/null || echo letterbox)"
start --sqs-listen 127.0.0.1:0
PATH="$(dirname "$py"):$PATH" LETTERBOX_SQS_URL="$sqs" bash tests/sqs/test_cli.sh
stop

log "boto3 across a kill -9"
start --sqs-listen 127.0.0.1:0
LETTERBOX_SQS_URL="$sqs" "$py" tests/sqs/test_crash.py before "$data/crash.json"
kill -9 "$pid"
wait "$pid" || true
pid=
start_again --sqs-listen 127.0.0.1:0
LETTERBOX_SQS_URL="$sqs" "$py" tests/sqs/test_crash.py after "$data/crash.json"
stop

log "boto3 with principals: SigV4"
keys="$("$server" auth new-aws-key)"
key_id="$(sed -n 's/^aws_access_key_id: *//p' <<<"$keys")"
sed -n 's/^aws_secret_access_key: *//p' <<<"$keys" >"$data/aws.secret"
cat >"$data/letterbox.toml" <<TOML
[[principals]]
name = "ci"
aws_access_key_id = "$key_id"
aws_secret_access_key_file = "$data/aws.secret"
admin = ["*"]
publish = ["*"]
consume = ["*"]
TOML
start --sqs-listen 127.0.0.1:0 --config "$data/letterbox.toml"
LETTERBOX_SQS_URL="$sqs" LETTERBOX_AWS_KEY_ID="$key_id" \
  LETTERBOX_AWS_SECRET="$(cat "$data/aws.secret")" "$py" tests/sqs/test_auth.py
stop

log "moto 5.2.5's SQS tests in server mode"
start --sqs-listen 127.0.0.1:5000 --sqs-account-id 123456789012
deselect=()
while read -r t; do
  [[ -z "$t" || "$t" == \#* ]] && continue
  deselect+=(--deselect "$t")
done <tests/sqs/moto-deselect.txt
(
  cd "$moto_dir"
  TEST_SERVER_MODE=true TEST_SERVER_MODE_ENDPOINT=http://localhost:5000 \
    MOTO_CALL_RESET_API=false AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
    "$root/$py" -m pytest -p no:cacheprovider -q --color=no \
    tests/test_sqs/test_sqs.py tests/test_sqs/test_sqs_message_attributes.py \
    "${deselect[@]}"
)
stop
echo "PASS: SQS clients against a real server"
