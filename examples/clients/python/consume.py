#!/usr/bin/env python3
"""A Letterbox consumer in Python, from the client generated from the proto.

It runs a payment queue through an outage: the payment service is down, so
each delivery is nacked with the reason; after three deliveries the broker
moves the message to the dead letter queue. The consumer reads the
dead-letter record there (Browse), the outage ends, it redrives the message
back and this time acks it. Every delivery's lease is extended before the
work starts, as a consumer does whose work may outlast the lease.

Run it from this directory against a server (`cargo run -- serve` at the
repository root):

    python3 -m venv .venv && .venv/bin/pip install -r requirements.txt
    .venv/bin/python -m grpc_tools.protoc -I ../../../proto \
        --python_out=gen --grpc_python_out=gen letterbox/v1/letterbox.proto
    .venv/bin/python consume.py

Environment: LETTERBOX_ADDR (default 127.0.0.1:50051); LETTERBOX_TOKEN, a
bearer token, for a server with principals; LETTERBOX_CA_CERT, a PEM file,
for a server with TLS (then give LETTERBOX_ADDR the name its certificate
carries, e.g. localhost:50051). It exits with 1 if the broker does not
behave as described.
"""

import os
import sys
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gen"))

import grpc  # noqa: E402
from letterbox.v1 import letterbox_pb2 as pb  # noqa: E402
from letterbox.v1 import letterbox_pb2_grpc as pb_grpc  # noqa: E402

QUEUE = "example.payments"
DLQ = "example.payments.dlq"
MAX_DELIVERIES = 3
RPC_TIMEOUT_S = 10  # every call has a deadline
LEASE_MS = 60_000  # what the work may take, asked for before it starts
PHASE_TIMEOUT_S = 30  # the scenario's steps take well under a second


class Failed(Exception):
    """The broker did not do what the example expects."""


class PaymentService:
    """Stands in for what the handler calls; down until `up` is set."""

    up = False

    def charge(self, body):
        if not self.up:
            raise RuntimeError("payment service unavailable")


def when(unix_ms):
    return datetime.fromtimestamp(unix_ms / 1000, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


class Consumer:
    def __init__(self, channel, metadata):
        self.admin = pb_grpc.AdminServiceStub(channel)
        self.msg = pb_grpc.MessagingServiceStub(channel)
        self.md = metadata  # credentials, on every call
        self.payments = PaymentService()
        self.acked = set()

    def call(self, method, request):
        return method(request, timeout=RPC_TIMEOUT_S, metadata=self.md)

    def setup(self):
        """The DLQ first, then the queue that uses it; both emptied, so that
        a second run starts like the first."""
        self.call(self.admin.CreateQueue, pb.CreateQueueRequest(name=DLQ))
        print(f"queue {DLQ} ready")
        policy = pb.DeadLetterPolicy(queue=DLQ, max_deliveries=MAX_DELIVERIES)
        self.call(
            self.admin.CreateQueue,
            pb.CreateQueueRequest(name=QUEUE, config=pb.QueueConfig(dead_letter=policy)),
        )
        print(f"queue {QUEUE} ready (dead letters to {DLQ} after {MAX_DELIVERIES} deliveries)")
        for name in (QUEUE, DLQ):
            self.call(self.admin.PurgeQueue, pb.PurgeQueueRequest(name=name))

    def publish(self, body):
        r = self.call(
            self.msg.Publish,
            pb.PublishRequest(
                queue=QUEUE,
                messages=[pb.PublishMessage(body=body, properties={"kind": "payment"})],
            ),
        )
        message_id = r.results[0].message_id
        print(f"published {message_id}")
        return message_id

    def handle(self, d):
        """One delivery: extend its lease, do the work, ack or nack."""
        ext = self.call(
            self.msg.ExtendLease,
            pb.ExtendLeaseRequest(items=[pb.ExtendItem(ack_token=d.ack_token, timeout_ms=LEASE_MS)]),
        ).results[0]
        if ext.status != pb.SETTLE_STATUS_OK:
            # The lease ran out before we got here: the message goes to
            # another consumer, this one must not work on it.
            print(f"delivery {d.delivery_count} of {d.message_id}: lease lost ({ext.error})")
            return
        history = f" (dead-lettered {len(d.dead_letters)} time(s) before)" if d.dead_letters else ""
        head = (
            f"delivery {d.delivery_count} of {d.message_id}{history}: "
            f"lease extended to {when(ext.lease_deadline_unix_ms)}"
        )
        try:
            self.payments.charge(d.body)
        except RuntimeError as e:
            r = self.call(
                self.msg.Nack,
                pb.NackRequest(items=[pb.NackItem(ack_token=d.ack_token, reason=str(e))]),
            ).results[0]
            if r.status != pb.SETTLE_STATUS_OK:
                raise Failed(f"nack of {d.message_id}: {r.error}")
            print(f"{head}, nacked: {e}")
            return
        r = self.call(self.msg.Ack, pb.AckRequest(ack_tokens=[d.ack_token])).results[0]
        if r.status != pb.SETTLE_STATUS_OK:
            # Acked too late (the lease ran out): it will come again.
            raise Failed(f"ack of {d.message_id}: {r.error}")
        self.acked.add(d.message_id)
        print(f"{head}, acked")

    def consume(self, until):
        """The consume loop: long-poll for up to 10 messages, handle each,
        until `until()` is true."""
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while not until():
            if time.monotonic() > deadline:
                raise Failed(f"not done after {PHASE_TIMEOUT_S} s")
            r = self.call(
                self.msg.Receive,
                pb.ReceiveRequest(queue=QUEUE, max_messages=10, wait_ms=1000),
            )
            for d in r.deliveries:
                self.handle(d)

    def browse_dlq(self, message_id):
        """The message as the DLQ holds it, or None. Browse leases nothing
        and counts no delivery."""
        token = ""
        while True:
            r = self.call(self.admin.Browse, pb.BrowseRequest(queue=DLQ, page_token=token))
            for m in r.messages:
                if m.message_id == message_id:
                    return m
            token = r.next_page_token
            if not token:
                return None

    def redrive(self, message_id):
        """Moves the message from the DLQ back to the queue it came from; the
        stream reports progress, the last answer has `done`."""
        last = None
        for progress in self.call(
            self.admin.Redrive, pb.RedriveRequest(queue=DLQ, message_ids=[message_id])
        ):
            last = progress
        if last is None or not last.done:
            raise Failed("the redrive stream ended without done")
        print(f"redrive: moved {last.moved} of {last.matched} matched")
        if last.moved != 1:
            raise Failed(f"redrive moved {last.moved}, expected 1")


def channel(addr):
    ca = os.environ.get("LETTERBOX_CA_CERT")
    if ca:
        with open(ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        return grpc.secure_channel(addr, creds)
    return grpc.insecure_channel(addr)


def main():
    addr = os.environ.get("LETTERBOX_ADDR", "127.0.0.1:50051")
    token = os.environ.get("LETTERBOX_TOKEN")
    metadata = [("authorization", f"Bearer {token}")] if token else []
    # One channel for the whole process: it multiplexes every call.
    with channel(addr) as ch:
        c = Consumer(ch, metadata)
        try:
            c.setup()
            message_id = c.publish(b'{"invoice": 42, "amount": "99.00"}')

            # The outage: every delivery fails until the broker gives up.
            c.consume(until=lambda: c.browse_dlq(message_id) is not None)
            m = c.browse_dlq(message_id)
            rec = m.dead_letters[-1]
            print(
                f"dead letter: {m.message_id} from {rec.source_queue}, "
                f"reason {pb.DeadLetterReason.Name(rec.reason).removeprefix('DEAD_LETTER_REASON_')} "
                f"after {rec.delivery_count} deliveries, "
                f'last nack reason "{rec.last_nack_reason}", at {when(rec.at_unix_ms)}'
            )

            # The outage is over: take it back and handle it.
            c.payments.up = True
            c.redrive(message_id)
            c.consume(until=lambda: message_id in c.acked)
        except (Failed, grpc.RpcError) as e:
            if isinstance(e, grpc.RpcError):
                e = f"{e.code().name}: {e.details()}"
            print(f"failed: {e}", file=sys.stderr)
            return 1
    print("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
