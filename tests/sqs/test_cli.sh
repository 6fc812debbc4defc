#!/usr/bin/env bash
# The AWS CLI (PyPI's awscli, as `aws`) against Letterbox's SQS endpoint
# (LETTERBOX_SQS_URL), run by tests/sqs/run.sh with the virtualenv's bin
# first on PATH:
#   - the dead-letter flow: receives that fail until maxReceiveCount; the
#     message read from the dead letter queue with DeadLetterQueueSourceArn;
#     moved back with a message move task;
#   - a FIFO flow: order within a group, deduplication.
set -euo pipefail
export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1
sqs() { aws --endpoint-url "$LETTERBOX_SQS_URL" --output text sqs "$@"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { [[ "$1" == "$2" ]] || fail "$3: got '$1', expected '$2'"; }

dlq="$(sqs create-queue --queue-name cli-orders-dlq --query QueueUrl)"
dlq_arn="$(sqs get-queue-attributes --queue-url "$dlq" --attribute-names QueueArn \
  --query Attributes.QueueArn)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/attributes.json" <<JSON
{"RedrivePolicy": "{\"deadLetterTargetArn\":\"$dlq_arn\",\"maxReceiveCount\":\"2\"}"}
JSON
q="$(sqs create-queue --queue-name cli-orders --attributes "file://$tmp/attributes.json" \
  --query QueueUrl)"
source_arn="$(sqs get-queue-attributes --queue-url "$q" --attribute-names QueueArn \
  --query Attributes.QueueArn)"
id="$(sqs send-message --queue-url "$q" --message-body 'charge 42' \
  --message-attributes '{"amount":{"DataType":"Number","StringValue":"42"}}' --query MessageId)"

# Two receives that fail: the visibility is let go at once.
for n in 1 2; do
  got="$(sqs receive-message --queue-url "$q" --wait-time-seconds 5 \
    --message-system-attribute-names ApproximateReceiveCount \
    --query 'Messages[0].[ReceiptHandle, Attributes.ApproximateReceiveCount]')"
  read -r handle count <<<"$got"
  expect "$count" "$n" "receive count"
  sqs change-message-visibility --queue-url "$q" --receipt-handle "$handle" --visibility-timeout 0
done
expect "$(sqs get-queue-attributes --queue-url "$dlq" --attribute-names ApproximateNumberOfMessages \
  --query Attributes.ApproximateNumberOfMessages)" 1 "dead letters"

got="$(sqs receive-message --queue-url "$dlq" --wait-time-seconds 5 --message-system-attribute-names All \
  --visibility-timeout 0 --query 'Messages[0].[MessageId, Attributes.DeadLetterQueueSourceArn, Body]')"
expect "$got" "$id	$source_arn	charge 42" "the dead letter"

task="$(sqs start-message-move-task --source-arn "$dlq_arn" --query TaskHandle)"
[[ -n "$task" ]] || fail "no task handle"
for _ in $(seq 200); do
  status="$(sqs list-message-move-tasks --source-arn "$dlq_arn" --query 'Results[0].Status')"
  [[ "$status" != RUNNING ]] && break
  sleep 0.05
done
expect "$status" COMPLETED "the move task"
expect "$(sqs list-message-move-tasks --source-arn "$dlq_arn" \
  --query 'Results[0].ApproximateNumberOfMessagesMoved')" 1 "moved"
got="$(sqs receive-message --queue-url "$q" --wait-time-seconds 5 --message-attribute-names All \
  --query 'Messages[0].[MessageId, MessageAttributes.amount.StringValue, ReceiptHandle]')"
read -r back amount handle <<<"$got"
expect "$back" "$id" "the message back"
expect "$amount" 42 "its attribute"
sqs delete-message --queue-url "$q" --receipt-handle "$handle"

# FIFO.
f="$(sqs create-queue --queue-name cli-jobs.fifo \
  --attributes FifoQueue=true,ContentBasedDeduplication=true --query QueueUrl)"
for b in a0 a1 a2 a0; do
  sqs send-message --queue-url "$f" --message-body "$b" --message-group-id a >/dev/null
done
bodies="$(sqs receive-message --queue-url "$f" --max-number-of-messages 10 --query 'Messages[].Body')"
expect "$bodies" "a0	a1	a2" "group order, the duplicate dropped"

echo "PASS: AWS CLI dead-letter and FIFO flows"
