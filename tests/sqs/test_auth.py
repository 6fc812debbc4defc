"""boto3 against Letterbox's SQS endpoint with principals
(LETTERBOX_SQS_URL; the access key LETTERBOX_AWS_KEY_ID of a principal
that may do everything, its secret LETTERBOX_AWS_SECRET): requests signed
by botocore's SigV4 are served, in the region of their scope; a wrong
secret, an unknown key and an unsigned request are refused with AWS's
codes; a presigned query-protocol URL works until it is changed."""

import os
import urllib.error
import urllib.request

import boto3
import botocore
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

URL = os.environ["LETTERBOX_SQS_URL"]
KEY = os.environ["LETTERBOX_AWS_KEY_ID"]
SECRET = os.environ["LETTERBOX_AWS_SECRET"]


def client(key=KEY, secret=SECRET, **kw):
    return boto3.client(
        "sqs",
        endpoint_url=URL,
        region_name="eu-west-2",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}, **kw),
    )


def refused(c, code):
    try:
        c.list_queues()
    except ClientError as e:
        assert e.response["Error"]["Code"] == code, e.response
        return
    raise AssertionError(f"not refused, expected {code}")


sqs = client()
url = sqs.create_queue(QueueName="signed")["QueueUrl"]
sqs.send_message(
    QueueUrl=url,
    MessageBody="héllo & <xml> + spaces",
    MessageAttributes={"k": {"DataType": "String", "StringValue": "v w"}},
)
got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"])["Messages"][0]
assert got["Body"] == "héllo & <xml> + spaces", got
arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
    "QueueArn"
]
assert arn.startswith("arn:aws:sqs:eu-west-2:"), arn

refused(client(secret=SECRET[::-1]), "SignatureDoesNotMatch")
refused(client(key="LBKNOBODYNOBODY00000"), "InvalidClientTokenId")
refused(client(signature_version=botocore.UNSIGNED), "MissingAuthenticationToken")

# A presigned URL of the query protocol.
req = AWSRequest(method="GET", url=f"{URL}?Action=ListQueues&Version=2012-11-05")
SigV4QueryAuth(Credentials(KEY, SECRET), "sqs", "eu-west-2", expires=60).add_auth(req)
with urllib.request.urlopen(req.url) as r:
    body = r.read().decode()
assert "<QueueUrl>" in body and "/signed</QueueUrl>" in body, body
changed = req.url.replace("Action=ListQueues", "Action=PurgeQueue")
try:
    urllib.request.urlopen(changed)
    raise AssertionError("a changed presigned URL was served")
except urllib.error.HTTPError as e:
    assert e.code == 403, e.code
    assert "SignatureDoesNotMatch" in e.read().decode()

print("PASS: boto3 with principals")
