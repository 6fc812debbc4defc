"""boto3 across a kill -9 of the server (tests/sqs/run.sh runs `before`,
kills the server with SIGKILL, restarts it on the same data directory,
then runs `after`): messages, their receive counts, a visibility deadline
and a running message move task survive the crash.

    test_crash.py before|after STATE_FILE   (LETTERBOX_SQS_URL: the server)
"""

import json
import os
import sys
import time

import boto3

URL = os.environ["LETTERBOX_SQS_URL"]
sqs = boto3.client(
    "sqs",
    endpoint_url=URL,
    region_name="us-east-1",
    aws_access_key_id="test",
    aws_secret_access_key="test",
)
# Long enough for the kill and the restart to happen inside it.
VISIBILITY = 10


def url(name):
    return sqs.get_queue_url(QueueName=name)["QueueUrl"]


def arn(q):
    return sqs.get_queue_attributes(QueueUrl=q, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]


def count(q, what="ApproximateNumberOfMessages"):
    return int(
        sqs.get_queue_attributes(QueueUrl=q, AttributeNames=[what])["Attributes"][what]
    )


def drain(q):
    ids = []
    while True:
        got = sqs.receive_message(QueueUrl=q, MaxNumberOfMessages=10).get("Messages", [])
        if not got:
            return ids
        for m in got:
            ids.append(m["MessageId"])
            sqs.delete_message(QueueUrl=q, ReceiptHandle=m["ReceiptHandle"])


def before(state_file):
    state = {}
    # Messages, with their attributes.
    work = sqs.create_queue(QueueName="crash-work")["QueueUrl"]
    state["work"] = [
        sqs.send_message(
            QueueUrl=work,
            MessageBody=f"job {i}",
            MessageAttributes={"n": {"DataType": "Number", "StringValue": str(i)}},
        )["MessageId"]
        for i in range(5)
    ]
    # A message received three times, visible again.
    counts = sqs.create_queue(QueueName="crash-counts")["QueueUrl"]
    sqs.send_message(QueueUrl=counts, MessageBody="counted")
    for n in (1, 2, 3):
        m = sqs.receive_message(
            QueueUrl=counts, VisibilityTimeout=0, AttributeNames=["ApproximateReceiveCount"]
        )["Messages"][0]
        assert m["Attributes"]["ApproximateReceiveCount"] == str(n), m
    # A message in flight until a deadline.
    inflight = sqs.create_queue(QueueName="crash-inflight")["QueueUrl"]
    sqs.send_message(QueueUrl=inflight, MessageBody="in flight")
    sqs.receive_message(QueueUrl=inflight, VisibilityTimeout=VISIBILITY)
    state["deadline"] = time.time() + VISIBILITY
    # Six dead letters, and a move task putting them back, two a second.
    dlq = sqs.create_queue(QueueName="crash-dlq")["QueueUrl"]
    src = sqs.create_queue(
        QueueName="crash-src",
        Attributes={
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": arn(dlq), "maxReceiveCount": 1})
        },
    )["QueueUrl"]
    state["dead"] = [
        sqs.send_message(QueueUrl=src, MessageBody=f"dead {i}")["MessageId"] for i in range(6)
    ]
    while count(dlq) < 6:
        sqs.receive_message(QueueUrl=src, MaxNumberOfMessages=10, VisibilityTimeout=0)
    sqs.start_message_move_task(SourceArn=arn(dlq), MaxNumberOfMessagesPerSecond=2)
    while count(src) < 1:
        time.sleep(0.02)
    task = sqs.list_message_move_tasks(SourceArn=arn(dlq))["Results"][0]
    assert task["Status"] == "RUNNING", task
    with open(state_file, "w") as f:
        json.dump(state, f)
    print("before the kill: the move task is running")


def after(state_file):
    with open(state_file) as f:
        state = json.load(f)
    # The visibility deadline held across the crash.
    inflight = url("crash-inflight")
    assert time.time() < state["deadline"] - 1, "the restart took too long to tell"
    assert "Messages" not in sqs.receive_message(QueueUrl=inflight)
    assert count(inflight, "ApproximateNumberOfMessagesNotVisible") == 1
    # The receive count held.
    m = sqs.receive_message(
        QueueUrl=url("crash-counts"), AttributeNames=["ApproximateReceiveCount"]
    )["Messages"][0]
    assert m["Attributes"]["ApproximateReceiveCount"] == "4", m
    # The messages held, with their attributes.
    work = url("crash-work")
    got = {}
    while len(got) < 5:
        for m in sqs.receive_message(
            QueueUrl=work, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        ).get("Messages", []):
            got[m["MessageId"]] = (m["Body"], m["MessageAttributes"]["n"]["StringValue"])
    assert got == {
        mid: (f"job {i}", str(i)) for i, mid in enumerate(state["work"])
    }, got
    # The move task ran on to its end, moving each message once.
    dlq_arn = arn(url("crash-dlq"))
    for _ in range(300):
        task = sqs.list_message_move_tasks(SourceArn=dlq_arn)["Results"][0]
        if task["Status"] != "RUNNING":
            break
        time.sleep(0.05)
    assert task["Status"] == "COMPLETED", task
    assert task["ApproximateNumberOfMessagesMoved"] == 6, task
    assert count(url("crash-dlq")) == 0
    back = drain(url("crash-src"))
    assert sorted(back) == sorted(state["dead"]), back
    # The deadline passes: the message is back, its count grown.
    time.sleep(max(0.0, state["deadline"] - time.time()))
    m = sqs.receive_message(
        QueueUrl=inflight, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"]
    )["Messages"][0]
    assert m["Body"] == "in flight" and m["Attributes"]["ApproximateReceiveCount"] == "2", m
    print("PASS: boto3 across a kill -9")


{"before": before, "after": after}[sys.argv[1]](sys.argv[2])
