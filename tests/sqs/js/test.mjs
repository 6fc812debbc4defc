// The AWS SDK for JavaScript v3 (@aws-sdk/client-sqs, which checks the
// MD5 digests of what it sends and receives) and sqs-consumer against
// Letterbox's SQS endpoint (LETTERBOX_SQS_URL), run by tests/sqs/run.sh:
//   - the dead-letter flow: a consumer whose handler fails until
//     maxReceiveCount; the message read from the dead letter queue with
//     DeadLetterQueueSourceArn; moved back with a message move task; then
//     consumed;
//   - a FIFO flow: order within a group, deduplication, batches.
import assert from "node:assert/strict";
import {
  ChangeMessageVisibilityCommand,
  CreateQueueCommand,
  GetQueueAttributesCommand,
  ListMessageMoveTasksCommand,
  ReceiveMessageCommand,
  SendMessageBatchCommand,
  SendMessageCommand,
  SQSClient,
  StartMessageMoveTaskCommand,
} from "@aws-sdk/client-sqs";
import { Consumer } from "sqs-consumer";

const sqs = new SQSClient({
  endpoint: process.env.LETTERBOX_SQS_URL,
  region: "us-east-1",
  credentials: { accessKeyId: "test", secretAccessKey: "test" },
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function attrs(url, names) {
  return (await sqs.send(new GetQueueAttributesCommand({ QueueUrl: url, AttributeNames: names })))
    .Attributes;
}

async function until(what, check, ms = 15000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await check();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

/** Runs a consumer until `done()` holds, then stops it. */
async function consume(options, done) {
  const errors = [];
  const c = Consumer.create({ sqs, waitTimeSeconds: 1, pollingWaitTimeMs: 0, ...options });
  c.on("error", (e) => errors.push(e));
  c.start();
  try {
    await until("the consumer", done);
  } finally {
    c.stop({ abort: true });
  }
  assert.deepEqual(errors, [], "no SQS errors");
}

async function deadLetterFlow() {
  const dlq = (await sqs.send(new CreateQueueCommand({ QueueName: "js-orders-dlq" }))).QueueUrl;
  const dlqArn = (await attrs(dlq, ["QueueArn"])).QueueArn;
  const q = (
    await sqs.send(
      new CreateQueueCommand({
        QueueName: "js-orders",
        Attributes: {
          RedrivePolicy: JSON.stringify({ deadLetterTargetArn: dlqArn, maxReceiveCount: 3 }),
        },
      }),
    )
  ).QueueUrl;
  const sourceArn = (await attrs(q, ["QueueArn"])).QueueArn;
  const sent = await sqs.send(
    new SendMessageCommand({
      QueueUrl: q,
      MessageBody: "charge 42 €",
      MessageAttributes: {
        amount: { DataType: "Number", StringValue: "42" },
        raw: { DataType: "Binary", BinaryValue: new Uint8Array([0, 1, 2]) },
      },
    }),
  );

  // A handler that fails: sqs-consumer makes the message visible again
  // at once, until the third receive ends and it is dead-lettered.
  const counts = [];
  await consume(
    {
      queueUrl: q,
      messageSystemAttributeNames: ["ApproximateReceiveCount"],
      terminateVisibilityTimeout: true,
      handleMessage: async (m) => {
        counts.push(m.Attributes.ApproximateReceiveCount);
        throw new Error("payment service said 503");
      },
    },
    async () => (await attrs(dlq, ["ApproximateNumberOfMessages"])).ApproximateNumberOfMessages === "1",
  );
  assert.deepEqual(counts, ["1", "2", "3"]);

  const [m] = (
    await sqs.send(
      new ReceiveMessageCommand({
        QueueUrl: dlq,
        WaitTimeSeconds: 5,
        MessageAttributeNames: ["All"],
        MessageSystemAttributeNames: ["All"],
      }),
    )
  ).Messages;
  assert.equal(m.MessageId, sent.MessageId);
  assert.equal(m.Body, "charge 42 €");
  assert.equal(m.Attributes.DeadLetterQueueSourceArn, sourceArn);
  assert.equal(m.MessageAttributes.amount.StringValue, "42");
  assert.deepEqual([...m.MessageAttributes.raw.BinaryValue], [0, 1, 2]);

  // Fixed: back to its source with a move task.
  await sqs.send(
    new ChangeMessageVisibilityCommand({ QueueUrl: dlq, ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0 }),
  );
  const { TaskHandle } = await sqs.send(new StartMessageMoveTaskCommand({ SourceArn: dlqArn }));
  assert.ok(TaskHandle);
  const task = await until("the move task", async () => {
    const [t] = (await sqs.send(new ListMessageMoveTasksCommand({ SourceArn: dlqArn }))).Results;
    return t.Status === "RUNNING" ? null : t;
  });
  assert.equal(task.Status, "COMPLETED");
  assert.equal(task.ApproximateNumberOfMessagesMoved, 1);

  const got = [];
  await consume(
    {
      queueUrl: q,
      messageAttributeNames: ["All"],
      handleMessage: async (msg) => {
        got.push(msg);
        return msg;
      },
    },
    async () => got.length === 1 && (await attrs(q, ["ApproximateNumberOfMessagesNotVisible"]))
      .ApproximateNumberOfMessagesNotVisible === "0",
  );
  assert.equal(got[0].MessageId, sent.MessageId);
  assert.equal(got[0].MessageAttributes.amount.StringValue, "42");
  const left = await attrs(q, ["ApproximateNumberOfMessages"]);
  assert.equal(left.ApproximateNumberOfMessages, "0", "sqs-consumer deleted it");
}

async function fifoFlow() {
  const q = (
    await sqs.send(
      new CreateQueueCommand({
        QueueName: "js-jobs.fifo",
        Attributes: { FifoQueue: "true", ContentBasedDeduplication: "true" },
      }),
    )
  ).QueueUrl;
  const entries = ["a0", "a1", "a2", "a3", "b0", "b1"].map((body, i) => ({
    Id: `e${i}`,
    MessageBody: body,
    MessageGroupId: body[0],
  }));
  const batch = await sqs.send(new SendMessageBatchCommand({ QueueUrl: q, Entries: entries }));
  assert.equal(batch.Successful.length, 6);
  // A duplicate within five minutes is taken and dropped.
  const dup = await sqs.send(new SendMessageCommand({ QueueUrl: q, MessageBody: "a0", MessageGroupId: "a" }));
  assert.equal(dup.MessageId, batch.Successful[0].MessageId);

  const seen = [];
  await consume(
    {
      queueUrl: q,
      batchSize: 10,
      suppressFifoWarning: true,
      handleMessageBatch: async (msgs) => {
        seen.push(...msgs.map((m) => m.Body));
        return msgs;
      },
    },
    async () => seen.length >= 6,
  );
  assert.deepEqual(seen.filter((b) => b[0] === "a"), ["a0", "a1", "a2", "a3"]);
  assert.deepEqual(seen.filter((b) => b[0] === "b"), ["b0", "b1"]);
  assert.equal(seen.length, 6);
}

await deadLetterFlow();
await fifoFlow();
console.log("PASS: JavaScript SDK and sqs-consumer dead-letter and FIFO flows");
