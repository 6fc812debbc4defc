"""boto3 against Letterbox's SQS endpoint (LETTERBOX_SQS_URL): the
dead-letter flow (send; fail until maxReceiveCount; read it from the dead
letter queue with DeadLetterQueueSourceArn; move it back with a message
move task) and a FIFO flow (order within a group, deduplication,
ReceiveRequestAttemptId retries)."""

import json
import os
import time
import uuid

import boto3

URL = os.environ["LETTERBOX_SQS_URL"]
sqs = boto3.client(
    "sqs",
    endpoint_url=URL,
    region_name="eu-west-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)


def dead_letter_flow():
    dlq = sqs.create_queue(QueueName="orders-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    assert dlq_arn.startswith("arn:aws:sqs:eu-west-1:000000000000:"), dlq_arn
    q = sqs.create_queue(
        QueueName="orders",
        Attributes={
            "VisibilityTimeout": "1",
            "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}
            ),
        },
    )["QueueUrl"]
    sent = sqs.send_message(
        QueueUrl=q,
        MessageBody="charge 42",
        MessageAttributes={"amount": {"DataType": "Number", "StringValue": "42"}},
    )
    for n in (1, 2):
        got = sqs.receive_message(
            QueueUrl=q, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"]
        )["Messages"]
        assert got[0]["Attributes"]["ApproximateReceiveCount"] == str(n), got
        # Fail: let the visibility run out.
    moved = sqs.receive_message(
        QueueUrl=dlq,
        WaitTimeSeconds=5,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    )["Messages"]
    m = moved[0]
    assert m["MessageId"] == sent["MessageId"], m
    assert m["Body"] == "charge 42"
    assert m["MessageAttributes"]["amount"] == {"DataType": "Number", "StringValue": "42"}
    source = sqs.get_queue_attributes(QueueUrl=q, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    assert m["Attributes"]["DeadLetterQueueSourceArn"] == source, m
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [q]
    # Fixed: put it back where it came from with a move task.
    sqs.change_message_visibility(
        QueueUrl=dlq, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
    )
    handle = sqs.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    for _ in range(100):
        task = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0]
        if task["Status"] != "RUNNING":
            break
        time.sleep(0.05)
    assert task["Status"] == "COMPLETED", task
    assert task["ApproximateNumberOfMessagesMoved"] == 1, task
    assert "TaskHandle" not in task and handle
    back = sqs.receive_message(
        QueueUrl=q,
        WaitTimeSeconds=5,
        MessageAttributeNames=["All"],
        AttributeNames=["ApproximateReceiveCount"],
    )["Messages"][0]
    assert back["MessageId"] == sent["MessageId"], back
    assert back["Body"] == "charge 42"
    assert back["MessageAttributes"]["amount"]["StringValue"] == "42"
    sqs.delete_message(QueueUrl=q, ReceiptHandle=back["ReceiptHandle"])
    attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0", attrs


def fifo_flow():
    q = sqs.create_queue(
        QueueName="jobs.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    for i in range(4):
        sqs.send_message(QueueUrl=q, MessageBody=f"a{i}", MessageGroupId="a")
    sqs.send_message(QueueUrl=q, MessageBody="a0", MessageGroupId="a")  # a duplicate
    sqs.send_message(QueueUrl=q, MessageBody="b0", MessageGroupId="b")
    attempt = str(uuid.uuid4())
    first = sqs.receive_message(
        QueueUrl=q, MaxNumberOfMessages=10, ReceiveRequestAttemptId=attempt
    )["Messages"]
    retry = sqs.receive_message(
        QueueUrl=q, MaxNumberOfMessages=10, ReceiveRequestAttemptId=attempt
    )["Messages"]
    assert [m["ReceiptHandle"] for m in first] == [m["ReceiptHandle"] for m in retry]
    bodies = [m["Body"] for m in first]
    assert [b for b in bodies if b.startswith("a")] == ["a0", "a1", "a2", "a3"], bodies
    assert "b0" in bodies
    sqs.delete_message_batch(
        QueueUrl=q,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
            for i, m in enumerate(first)
        ],
    )
    attrs = sqs.get_queue_attributes(QueueUrl=q, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessages"] == "0", attrs
    assert attrs["FifoQueue"] == "true"


dead_letter_flow()
fifo_flow()
print("PASS: boto3 dead-letter and FIFO flows")
