#!/usr/bin/env python3
"""The core dead-letter flow, through a Python client generated from the proto,
against a real `letterbox serve`.

Run it with tests/python/run.sh, which builds the server and the client first.
By hand:

    tests/python/generate.sh                       # needs grpcio-tools
    python3 tests/python/test_core_flow.py

Environment (all optional):
    LETTERBOX_BIN        the server binary (default target/debug/letterbox)
    LETTERBOX_PY_CLIENT  the generated client (default target/python-client)

The script starts its own server on 127.0.0.1:0 with a fresh data directory,
stops it with SIGTERM (and expects exit code 0), removes the directory, and
exits non-zero on any failure. The server never outlives the script: it is
killed in a `finally`, and on Linux also by the kernel if the script dies.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_BIN = os.environ.get(
    "LETTERBOX_BIN", os.path.join(ROOT, "target", "debug", "letterbox")
)
CLIENT_DIR = os.environ.get(
    "LETTERBOX_PY_CLIENT", os.path.join(ROOT, "target", "python-client")
)
sys.path.insert(0, CLIENT_DIR)

import grpc  # noqa: E402
from letterbox_server import (  # noqa: E402
    STARTUP_TIMEOUT_S,
    CheckFailed,
    Server,
    check,
    check_eq,
)

try:
    from letterbox.v1 import letterbox_pb2 as pb  # noqa: E402
    from letterbox.v1 import letterbox_pb2_grpc as pb_grpc  # noqa: E402
except ImportError as e:
    sys.exit(
        f"cannot import the generated client from {CLIENT_DIR} ({e}); "
        "run tests/python/generate.sh first"
    )

RPC_TIMEOUT_S = 15


def step(text):
    print(f"-- {text}", flush=True)


# google.rpc.Status and google.rpc.BadRequest, built at run time so that no
# further package (googleapis-common-protos) is needed to read the
# `grpc-status-details-bin` trailer. `Any` is declared by its two fields,
# which is the same encoding.
def _status_classes():
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    T = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(
        name="letterbox_test/google_rpc.proto", package="google.rpc", syntax="proto3"
    )

    def message(name, *fields):
        m = f.message_type.add(name=name)
        for number, (fname, ftype, label, type_name) in enumerate(fields, 1):
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    message("AnyLike", ("type_url", T.TYPE_STRING, opt, None), ("value", T.TYPE_BYTES, opt, None))
    message(
        "Status",
        ("code", T.TYPE_INT32, opt, None),
        ("message", T.TYPE_STRING, opt, None),
        ("details", T.TYPE_MESSAGE, rep, ".google.rpc.AnyLike"),
    )
    message(
        "FieldViolation",
        ("field", T.TYPE_STRING, opt, None),
        ("description", T.TYPE_STRING, opt, None),
    )
    message(
        "BadRequest",
        ("field_violations", T.TYPE_MESSAGE, rep, ".google.rpc.FieldViolation"),
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = message_factory.GetMessageClass
    return (
        get(pool.FindMessageTypeByName("google.rpc.Status")),
        get(pool.FindMessageTypeByName("google.rpc.BadRequest")),
    )


StatusProto, BadRequestProto = _status_classes()


def bad_request_fields(err):
    """Field names of the BadRequest violations carried by a failed call."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            st = StatusProto.FromString(value)
            return [
                v.field
                for d in st.details
                if d.type_url.endswith("/google.rpc.BadRequest")
                for v in BadRequestProto.FromString(d.value).field_violations
            ]
    return []


def expect_error(call, request, code, *mentions):
    """Makes a call that must fail with `code` and a message naming each of
    `mentions`; returns the error."""
    try:
        call(request, timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as err:
        check_eq(err.code(), code, f"status code of {type(request).__name__}")
        for m in mentions:
            check(m in err.details(), f"error message {err.details()!r} names {m!r}")
        return err
    raise CheckFailed(f"{type(request).__name__} {request} succeeded, expected {code}")


def core_flow(channel):
    admin = pb_grpc.AdminServiceStub(channel)
    msg = pb_grpc.MessagingServiceStub(channel)
    t = RPC_TIMEOUT_S

    step("create invoices.dlq, then invoices with dead_letter {invoices.dlq, 3}")
    r = admin.CreateQueue(pb.CreateQueueRequest(name="invoices.dlq"), timeout=t)
    check(r.created, "invoices.dlq created")
    config = pb.QueueConfig(
        dead_letter=pb.DeadLetterPolicy(queue="invoices.dlq", max_deliveries=3)
    )
    r = admin.CreateQueue(pb.CreateQueueRequest(name="invoices", config=config), timeout=t)
    check(r.created, "invoices created")
    check_eq(r.queue.name, "invoices", "created queue's name")
    check_eq(r.queue.config.kind, pb.QUEUE_KIND_STANDARD, "kind in force")
    check_eq(r.queue.config.dead_letter.queue, "invoices.dlq", "dead letter queue")
    check_eq(r.queue.config.dead_letter.max_deliveries, 3, "max_deliveries")
    check(r.queue.config.HasField("ack_timeout_ms"), "ack_timeout_ms in force is set")
    r = admin.CreateQueue(pb.CreateQueueRequest(name="invoices", config=config), timeout=t)
    check(not r.created, "creating the same queue again is a no-op")
    r = admin.GetQueue(pb.GetQueueRequest(name="invoices.dlq"), timeout=t)
    check_eq(list(r.queue.dead_letter_sources), ["invoices"], "DLQ's dead_letter_sources")

    step("publish one message with a property")
    r = msg.Publish(
        pb.PublishRequest(
            queue="invoices",
            messages=[
                pb.PublishMessage(body=b"invoice #42", properties={"customer": "acme"})
            ],
        ),
        timeout=t,
    )
    check_eq(len(r.results), 1, "publish results")
    message_id = r.results[0].message_id
    check(message_id, "server assigned a message id")
    check(not r.results[0].duplicate, "not a duplicate")
    print(f"   published {message_id}")

    reasons = [f"tax service unavailable (attempt {n})" for n in (1, 2, 3)]
    for n in (1, 2, 3):
        step(f"receive (delivery {n}) and nack it")
        r = msg.Receive(
            pb.ReceiveRequest(queue="invoices", max_messages=1, wait_ms=5000), timeout=t
        )
        check_eq(len(r.deliveries), 1, f"deliveries on receive {n}")
        d = r.deliveries[0]
        check_eq(d.message_id, message_id, "delivered message id")
        check_eq(d.delivery_count, n, "delivery_count")
        check_eq(d.failed_attempts, n - 1, "failed_attempts before this delivery")
        check_eq(d.body, b"invoice #42", "body")
        check_eq(dict(d.properties), {"customer": "acme"}, "properties")
        check_eq(d.queue, "invoices", "delivered from")
        check(d.ack_token, "an ack token")
        check(d.lease_deadline_unix_ms > 0, "a lease deadline")
        check_eq(len(d.attempts), n - 1, "attempts so far")
        r = msg.Nack(
            pb.NackRequest(items=[pb.NackItem(ack_token=d.ack_token, reason=reasons[n - 1])]),
            timeout=t,
        )
        check_eq(len(r.results), 1, "nack results")
        check_eq(r.results[0].status, pb.SETTLE_STATUS_OK, "nack status")
        check_eq(r.results[0].code, 0, "nack code")
        if n == 1:
            step("a second nack of the same token fails for that token only")
            r = msg.Nack(
                pb.NackRequest(items=[pb.NackItem(ack_token=d.ack_token, reason="again")]),
                timeout=t,
            )
            check_eq(r.results[0].status, pb.SETTLE_STATUS_LEASE_EXPIRED, "stale nack status")
            check_eq(r.results[0].code, grpc.StatusCode.FAILED_PRECONDITION.value[0], "stale nack code")
            check(r.results[0].error, "stale nack says why")

    step("the source queue is empty")
    r = msg.Receive(pb.ReceiveRequest(queue="invoices", max_messages=10, wait_ms=0), timeout=t)
    check_eq(len(r.deliveries), 0, "deliveries from invoices after the move")
    r = admin.Browse(pb.BrowseRequest(queue="invoices"), timeout=t)
    check_eq(len(r.messages), 0, "messages browsed in invoices")
    s = admin.GetQueueStats(pb.GetQueueStatsRequest(name="invoices"), timeout=t).stats
    check_eq(
        (s.total, s.ready, s.in_flight, s.published, s.nacked, s.dead_lettered, s.acked),
        (0, 0, 0, 1, 3, 1, 0),
        "invoices (total, ready, in_flight, published, nacked, dead_lettered, acked)",
    )

    step("browse the DLQ: the dead-letter record")
    r = admin.Browse(pb.BrowseRequest(queue="invoices.dlq"), timeout=t)
    check_eq(len(r.messages), 1, "messages browsed in invoices.dlq")
    b = r.messages[0]
    check_eq(b.message_id, message_id, "browsed message id")
    check_eq(b.body, b"invoice #42", "browsed body")
    check_eq(dict(b.properties), {"customer": "acme"}, "browsed properties")
    check_eq(b.state, pb.MESSAGE_STATE_READY, "browsed state")
    check_eq(b.delivery_count, 0, "delivery_count in the DLQ before any delivery")
    check_eq(len(b.dead_letters), 1, "dead-letter records")
    rec = b.dead_letters[0]
    check_eq(rec.source_queue, "invoices", "record's source_queue")
    check_eq(rec.reason, pb.DEAD_LETTER_REASON_MAX_DELIVERIES, "record's reason")
    check_eq(rec.delivery_count, 3, "record's delivery_count")
    check_eq(rec.failed_attempts, 3, "record's failed_attempts")
    check_eq(rec.last_nack_reason, reasons[2], "record's last_nack_reason")
    check(rec.at_unix_ms > 0, "record's time")
    print(
        f"   {b.message_id} from {rec.source_queue} after {rec.delivery_count} "
        f"deliveries ({pb.DeadLetterReason.Name(rec.reason)}), "
        f"last error {rec.last_nack_reason!r}"
    )
    r = admin.Browse(pb.BrowseRequest(queue="invoices.dlq"), timeout=t)
    check_eq(r.messages[0].delivery_count, 0, "browsing is not a delivery")

    step("receive from the DLQ and ack")
    r = msg.Receive(
        pb.ReceiveRequest(queue="invoices.dlq", max_messages=1, wait_ms=5000), timeout=t
    )
    check_eq(len(r.deliveries), 1, "deliveries from invoices.dlq")
    d = r.deliveries[0]
    check_eq(d.message_id, message_id, "DLQ delivery's id")
    check_eq(d.delivery_count, 1, "DLQ delivery's delivery_count")
    check_eq(d.queue, "invoices.dlq", "DLQ delivery's queue")
    check_eq(
        [(x.source_queue, x.reason, x.delivery_count) for x in d.dead_letters],
        [("invoices", pb.DEAD_LETTER_REASON_MAX_DELIVERIES, 3)],
        "DLQ delivery's dead-letter records",
    )
    r = msg.Ack(pb.AckRequest(ack_tokens=[d.ack_token]), timeout=t)
    check_eq(
        [(x.ack_token, x.status, x.code) for x in r.results],
        [(d.ack_token, pb.SETTLE_STATUS_OK, 0)],
        "ack results",
    )

    step("stats of the DLQ")
    r = admin.GetQueueStats(pb.GetQueueStatsRequest(name="invoices.dlq"), timeout=t)
    check_eq(r.name, "invoices.dlq", "stats' queue name")
    s = r.stats
    check_eq(s.acked, 1, "invoices.dlq acked")
    check_eq(s.dead_letters_received, 1, "invoices.dlq dead_letters_received")
    check_eq(s.total, 0, "invoices.dlq total")
    check_eq(s.in_flight, 0, "invoices.dlq in_flight")
    r = admin.Browse(pb.BrowseRequest(queue="invoices.dlq"), timeout=t)
    check_eq(len(r.messages), 0, "messages left in invoices.dlq")


def errors(channel):
    admin = pb_grpc.AdminServiceStub(channel)
    msg = pb_grpc.MessagingServiceStub(channel)

    step("bad requests fail with the right code, naming the field or the value")
    err = expect_error(
        admin.CreateQueue,
        pb.CreateQueueRequest(name="bad", config=pb.QueueConfig(ack_timeout_ms=5)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.ack_timeout_ms",
    )
    print(f"   INVALID_ARGUMENT: {err.details()}")
    check_eq(bad_request_fields(err), ["config.ack_timeout_ms"], "BadRequest field violations")
    err = expect_error(
        admin.CreateQueue,
        pb.CreateQueueRequest(
            name="bad",
            config=pb.QueueConfig(
                dead_letter=pb.DeadLetterPolicy(queue="invoices.dlq", max_deliveries=1001)
            ),
        ),
        grpc.StatusCode.INVALID_ARGUMENT,
        "config.dead_letter.max_deliveries",
    )
    check_eq(
        bad_request_fields(err), ["config.dead_letter.max_deliveries"], "BadRequest field violations"
    )
    expect_error(
        admin.CreateQueue,
        pb.CreateQueueRequest(
            name="invoices",
            config=pb.QueueConfig(
                dead_letter=pb.DeadLetterPolicy(queue="invoices.dlq", max_deliveries=5)
            ),
        ),
        grpc.StatusCode.ALREADY_EXISTS,
        "invoices",
    )
    expect_error(
        admin.GetQueue,
        pb.GetQueueRequest(name="no-such-queue"),
        grpc.StatusCode.NOT_FOUND,
        "no-such-queue",
    )
    expect_error(
        msg.Publish,
        pb.PublishRequest(queue="no-such-queue", messages=[pb.PublishMessage(body=b"x")]),
        grpc.StatusCode.NOT_FOUND,
        "no-such-queue",
    )

    step("refused requests changed nothing")
    r = admin.GetQueue(pb.GetQueueRequest(name="invoices"), timeout=RPC_TIMEOUT_S)
    check_eq(r.queue.config.dead_letter.max_deliveries, 3, "invoices' max_deliveries")
    expect_error(
        admin.GetQueue, pb.GetQueueRequest(name="bad"), grpc.StatusCode.NOT_FOUND, "bad"
    )


def riding_acks(channel):
    admin = pb_grpc.AdminServiceStub(channel)
    msg = pb_grpc.MessagingServiceStub(channel)
    t = RPC_TIMEOUT_S

    step("acks riding on a Receive are reported when the receive fails after them")
    for name in ("jobs", "inbox"):
        admin.CreateQueue(pb.CreateQueueRequest(name=name), timeout=t)
    msg.Publish(
        pb.PublishRequest(queue="jobs", messages=[pb.PublishMessage(body=b"job")]), timeout=t
    )
    d = msg.Receive(pb.ReceiveRequest(queue="jobs", max_messages=1), timeout=t).deliveries[0]
    # The acks are durable before the receive waits on the empty queue;
    # the queue is then deleted under it.
    waiting = msg.Receive.future(
        pb.ReceiveRequest(queue="inbox", wait_ms=10_000, ack_tokens=[d.ack_token]), timeout=t
    )
    for _ in range(500):
        s = admin.GetQueueStats(pb.GetQueueStatsRequest(name="jobs"), timeout=t).stats
        if s.acked == 1:
            break
        time.sleep(0.01)
    check_eq(s.acked, 1, "jobs acked while the receive waits")
    admin.DeleteQueue(pb.DeleteQueueRequest(name="inbox"), timeout=t)
    r = waiting.result()
    check_eq(
        [(x.ack_token, x.status, x.code) for x in r.ack_results],
        [(d.ack_token, pb.SETTLE_STATUS_OK, 0)],
        "the riding ack's result",
    )
    check_eq(r.receive_code, grpc.StatusCode.NOT_FOUND.value[0], "receive_code")
    check("inbox" in r.receive_error, f"receive_error names the queue: {r.receive_error!r}")
    check_eq(len(r.deliveries), 0, "deliveries of the failed receive")
    print(f"   acked, then the receive failed: {r.receive_error}")


def main():
    check(os.access(SERVER_BIN, os.X_OK), f"server binary {SERVER_BIN} (cargo build --bin letterbox)")
    # A SIGTERM to this script unwinds through the `finally` blocks too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="letterbox-pytest-")
    server = None
    ok = False
    try:
        server = Server(SERVER_BIN, os.path.join(tmp, "data"), os.path.join(tmp, "server.log"))
        print(f"server {server.proc.pid} listening on {server.addr}", flush=True)
        with grpc.insecure_channel(server.addr) as channel:
            grpc.channel_ready_future(channel).result(timeout=STARTUP_TIMEOUT_S)
            core_flow(channel)
            errors(channel)
            riding_acks(channel)
        step("SIGTERM the server")
        code = server.terminate()
        check_eq(code, 0, "server exit code after SIGTERM")
        ok = True
    except (CheckFailed, grpc.RpcError, subprocess.TimeoutExpired, OSError) as e:
        if isinstance(e, grpc.RpcError):
            e = f"unexpected RPC error {e.code()}: {e.details()}"
        print(f"FAIL: {e}", file=sys.stderr)
        if server is not None:
            print(f"--- server log (tail) ---\n{server.log_tail()}", file=sys.stderr)
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if not ok:
        return 1
    print("PASS: core flow against a real server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
