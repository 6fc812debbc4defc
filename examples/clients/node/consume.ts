// A Letterbox consumer in TypeScript, on @grpc/grpc-js with the types that
// proto-loader-gen-types generates from the proto.
//
// It runs a payment queue through an outage: the payment service is down,
// so each delivery is nacked with the reason; after three deliveries the
// broker moves the message to the dead letter queue. The consumer reads the
// dead-letter record there (Browse), the outage ends, it redrives the
// message back and this time acks it. Every delivery's lease is extended
// before the work starts, as a consumer does whose work may outlast the
// lease.
//
// Run it from this directory against a server (`cargo run -- serve` at the
// repository root):
//
//   npm install && npm run generate && npm run build && npm start
//
// Environment: LETTERBOX_ADDR (default 127.0.0.1:50051); LETTERBOX_TOKEN, a
// bearer token, for a server with principals; LETTERBOX_CA_CERT, a PEM
// file, for a server with TLS (then give LETTERBOX_ADDR the name its
// certificate carries, e.g. localhost:50051); LETTERBOX_PROTO_DIR, where
// letterbox/v1/letterbox.proto is (default the repository's proto/). It
// exits with 1 if the broker does not behave as described.

import * as fs from 'node:fs';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import type { ProtoGrpcType } from './gen/letterbox';
import type { AdminServiceClient } from './gen/letterbox/v1/AdminService';
import type { BrowseResponse__Output } from './gen/letterbox/v1/BrowseResponse';
import type { BrowsedMessage__Output } from './gen/letterbox/v1/BrowsedMessage';
import type { Delivery__Output } from './gen/letterbox/v1/Delivery';
import type { MessagingServiceClient } from './gen/letterbox/v1/MessagingService';
import type { PublishResponse__Output } from './gen/letterbox/v1/PublishResponse';
import type { ReceiveResponse__Output } from './gen/letterbox/v1/ReceiveResponse';
import type { RedriveResponse__Output } from './gen/letterbox/v1/RedriveResponse';
import type { SettleResult__Output } from './gen/letterbox/v1/SettleResult';

const QUEUE = 'example.payments';
const DLQ = 'example.payments.dlq';
const MAX_DELIVERIES = 3;
const RPC_TIMEOUT_MS = 10_000; // every call has a deadline
const LEASE_MS = 60_000; // what the work may take, asked for before it starts
const PHASE_TIMEOUT_MS = 30_000; // the scenario's steps take well under a second

/** The broker did not do what the example expects. */
class Failed extends Error {}

/** Stands in for what the handler calls; down until `up` is set. */
class PaymentService {
  up = false;
  charge(_body: Buffer): void {
    if (!this.up) throw new Error('payment service unavailable');
  }
}

function when(unixMs: string): string {
  return new Date(Number(unixMs)).toISOString().slice(11, 23);
}

/** One unary call as a promise. */
function unary<Res>(start: (callback: grpc.requestCallback<Res>) => unknown): Promise<Res> {
  return new Promise((resolve, reject) => {
    start((err, res) => (err || res === undefined ? reject(err) : resolve(res)));
  });
}

class Consumer {
  readonly payments = new PaymentService();
  readonly acked = new Set<string>();

  constructor(
    private readonly admin: AdminServiceClient,
    private readonly msg: MessagingServiceClient,
    private readonly metadata: grpc.Metadata, // credentials, on every call
  ) {}

  private opts(): grpc.CallOptions {
    return { deadline: Date.now() + RPC_TIMEOUT_MS };
  }

  /** The DLQ first, then the queue that uses it; both emptied, so that a
   * second run starts like the first. */
  async setup(): Promise<void> {
    await unary((cb) => this.admin.CreateQueue({ name: DLQ }, this.metadata, this.opts(), cb));
    console.log(`queue ${DLQ} ready`);
    const config = { dead_letter: { queue: DLQ, max_deliveries: MAX_DELIVERIES } };
    await unary((cb) => this.admin.CreateQueue({ name: QUEUE, config }, this.metadata, this.opts(), cb));
    console.log(`queue ${QUEUE} ready (dead letters to ${DLQ} after ${MAX_DELIVERIES} deliveries)`);
    for (const name of [QUEUE, DLQ]) {
      await unary((cb) => this.admin.PurgeQueue({ name }, this.metadata, this.opts(), cb));
    }
  }

  async publish(body: Buffer): Promise<string> {
    const r = await unary<PublishResponse__Output>((cb) =>
      this.msg.Publish(
        { queue: QUEUE, messages: [{ body, properties: { kind: 'payment' } }] },
        this.metadata,
        this.opts(),
        cb,
      ),
    );
    const id = r.results[0].message_id;
    console.log(`published ${id}`);
    return id;
  }

  private async settle(
    call: (cb: grpc.requestCallback<{ results: SettleResult__Output[] }>) => unknown,
  ): Promise<SettleResult__Output> {
    return (await unary(call)).results[0];
  }

  /** One delivery: extend its lease, do the work, ack or nack. */
  async handle(d: Delivery__Output): Promise<void> {
    const ext = await this.settle((cb) =>
      this.msg.ExtendLease(
        { items: [{ ack_token: d.ack_token, timeout_ms: LEASE_MS }] },
        this.metadata,
        this.opts(),
        cb,
      ),
    );
    if (ext.status !== 'SETTLE_STATUS_OK') {
      // The lease ran out before we got here: the message goes to another
      // consumer, this one must not work on it.
      console.log(`delivery ${d.delivery_count} of ${d.message_id}: lease lost (${ext.error})`);
      return;
    }
    const history = d.dead_letters.length > 0 ? ` (dead-lettered ${d.dead_letters.length} time(s) before)` : '';
    const head =
      `delivery ${d.delivery_count} of ${d.message_id}${history}: ` +
      `lease extended to ${when(ext.lease_deadline_unix_ms)}`;
    try {
      this.payments.charge(d.body);
    } catch (e) {
      const reason = (e as Error).message;
      const r = await this.settle((cb) =>
        this.msg.Nack({ items: [{ ack_token: d.ack_token, reason }] }, this.metadata, this.opts(), cb),
      );
      if (r.status !== 'SETTLE_STATUS_OK') throw new Failed(`nack of ${d.message_id}: ${r.error}`);
      console.log(`${head}, nacked: ${reason}`);
      return;
    }
    const r = await this.settle((cb) =>
      this.msg.Ack({ ack_tokens: [d.ack_token] }, this.metadata, this.opts(), cb),
    );
    // Acked too late (the lease ran out): it will come again.
    if (r.status !== 'SETTLE_STATUS_OK') throw new Failed(`ack of ${d.message_id}: ${r.error}`);
    this.acked.add(d.message_id);
    console.log(`${head}, acked`);
  }

  /** The consume loop: long-poll for up to 10 messages, handle each, until
   * `until()` is true. */
  async consume(until: () => Promise<boolean> | boolean): Promise<void> {
    const deadline = Date.now() + PHASE_TIMEOUT_MS;
    while (!(await until())) {
      if (Date.now() > deadline) throw new Failed(`not done after ${PHASE_TIMEOUT_MS / 1000} s`);
      const r = await unary<ReceiveResponse__Output>((cb) =>
        this.msg.Receive({ queue: QUEUE, max_messages: 10, wait_ms: 1000 }, this.metadata, this.opts(), cb),
      );
      for (const d of r.deliveries) await this.handle(d);
    }
  }

  /** The message as the DLQ holds it, or undefined. Browse leases nothing
   * and counts no delivery. */
  async browseDlq(messageId: string): Promise<BrowsedMessage__Output | undefined> {
    let page_token = '';
    for (;;) {
      const r = await unary<BrowseResponse__Output>((cb) =>
        this.admin.Browse({ queue: DLQ, page_token }, this.metadata, this.opts(), cb),
      );
      const m = r.messages.find((x) => x.message_id === messageId);
      if (m) return m;
      page_token = r.next_page_token;
      if (!page_token) return undefined;
    }
  }

  /** Moves the message from the DLQ back to the queue it came from; the
   * stream reports progress, the last answer has `done`. */
  async redrive(messageId: string): Promise<void> {
    const stream = this.admin.Redrive({ queue: DLQ, message_ids: [messageId] }, this.metadata, this.opts());
    let last: RedriveResponse__Output | undefined;
    for await (const progress of stream) last = progress as RedriveResponse__Output;
    if (!last?.done) throw new Failed('the redrive stream ended without done');
    console.log(`redrive: moved ${last.moved} of ${last.matched} matched`);
    if (last.moved !== '1') throw new Failed(`redrive moved ${last.moved}, expected 1`);
  }
}

async function main(): Promise<number> {
  const addr = process.env.LETTERBOX_ADDR ?? '127.0.0.1:50051';
  const token = process.env.LETTERBOX_TOKEN;
  const ca = process.env.LETTERBOX_CA_CERT;
  const protoDir = process.env.LETTERBOX_PROTO_DIR ?? path.join(__dirname, '..', '..', '..', '..', 'proto');

  const definition = protoLoader.loadSync('letterbox/v1/letterbox.proto', {
    includeDirs: [protoDir],
    // As in `npm run generate`, so that the generated types hold.
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const v1 = (grpc.loadPackageDefinition(definition) as unknown as ProtoGrpcType).letterbox.v1;
  const creds = ca ? grpc.credentials.createSsl(fs.readFileSync(ca)) : grpc.credentials.createInsecure();
  const metadata = new grpc.Metadata();
  if (token) metadata.set('authorization', `Bearer ${token}`);
  // One channel for the whole process, shared by both services' clients.
  const admin = new v1.AdminService(addr, creds);
  const msg = new v1.MessagingService(addr, creds, { channelOverride: admin.getChannel() });
  const c = new Consumer(admin, msg, metadata);
  try {
    await c.setup();
    const messageId = await c.publish(Buffer.from('{"invoice": 42, "amount": "99.00"}'));

    // The outage: every delivery fails until the broker gives up.
    await c.consume(async () => (await c.browseDlq(messageId)) !== undefined);
    const m = (await c.browseDlq(messageId))!;
    const rec = m.dead_letters[m.dead_letters.length - 1];
    console.log(
      `dead letter: ${m.message_id} from ${rec.source_queue}, ` +
        `reason ${rec.reason.replace('DEAD_LETTER_REASON_', '')} after ${rec.delivery_count} deliveries, ` +
        `last nack reason "${rec.last_nack_reason}", at ${when(rec.at_unix_ms)}`,
    );

    // The outage is over: take it back and handle it.
    c.payments.up = true;
    await c.redrive(messageId);
    await c.consume(() => c.acked.has(messageId));
  } catch (e) {
    const err = e as Partial<grpc.ServiceError> & Error;
    console.error(
      err.code !== undefined ? `failed: ${grpc.status[err.code]}: ${err.details}` : `failed: ${err.message}`,
    );
    return 1;
  } finally {
    admin.close();
  }
  console.log('done');
  return 0;
}

main().then((code) => process.exit(code));
