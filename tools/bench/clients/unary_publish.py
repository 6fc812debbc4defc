"""Unary Publish from Python, as a user writes it with generated stubs.

One unary `Publish` of one 1 KiB message per call, `--window` calls in
flight (asyncio, grpc.aio), spread over `--channels` channels in turn;
or, with `--stream`, one `PublishStream` with `--window` requests
unanswered. Prints one line: messages, seconds, msg/s.

    python -m grpc_tools.protoc -I proto --python_out=GEN \
        --grpc_python_out=GEN letterbox/v1/letterbox.proto
    PYTHONPATH=GEN python tools/bench/clients/unary_publish.py \
        --target 127.0.0.1:50051 --queue bench --window 64 --count 20000

The queue must exist (`letterbox queue create bench`). Against
`tonic-floor` any queue name does. Needs grpcio and protobuf (see
docs/clients.md, Python).
"""

import argparse
import asyncio
import time

import grpc
from letterbox.v1 import letterbox_pb2 as pb
from letterbox.v1 import letterbox_pb2_grpc as rpc


async def unary(stubs, queue, body, window, count):
    sem = asyncio.Semaphore(window)
    done = 0

    async def one(i):
        nonlocal done
        try:
            r = await stubs[i % len(stubs)].Publish(
                pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(body=body)])
            )
            assert len(r.results) == 1
            done += 1
        finally:
            sem.release()

    tasks = []
    for i in range(count):
        await sem.acquire()
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return done


async def stream(stub, queue, body, window, count):
    sem = asyncio.Semaphore(window)

    async def requests():
        for i in range(count):
            await sem.acquire()
            yield pb.PublishStreamRequest(
                sequence=i,
                publish=pb.PublishRequest(queue=queue, messages=[pb.PublishMessage(body=body)]),
            )

    done = 0
    async for r in stub.PublishStream(requests()):
        if r.code != 0:
            raise RuntimeError(f"publish {r.sequence}: {r.code} {r.error}")
        done += 1
        sem.release()
    return done


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--target", default="127.0.0.1:50051")
    p.add_argument("--queue", default="bench")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--count", type=int, default=20000)
    p.add_argument("--channels", type=int, default=1)
    p.add_argument("--stream", action="store_true")
    a = p.parse_args()
    body = b"x" * 1024
    channels = [grpc.aio.insecure_channel(a.target) for _ in range(a.channels)]
    stubs = [rpc.MessagingServiceStub(c) for c in channels]
    started = time.monotonic()
    if a.stream:
        n = await stream(stubs[0], a.queue, body, a.window, a.count)
    else:
        n = await unary(stubs, a.queue, body, a.window, a.count)
    took = time.monotonic() - started
    mode = "stream" if a.stream else f"unary channels={a.channels}"
    print(f"python {mode} window={a.window}: {n} msgs in {took:.2f}s = {n / took:.0f} msg/s")
    for c in channels:
        await c.close()


if __name__ == "__main__":
    asyncio.run(main())
