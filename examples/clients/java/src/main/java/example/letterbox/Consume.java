package example.letterbox;

import com.google.protobuf.ByteString;
import io.grpc.ChannelCredentials;
import io.grpc.ClientInterceptor;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.stub.MetadataUtils;
import java.io.File;
import java.io.IOException;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.HashSet;
import java.util.Iterator;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import letterbox.v1.AdminServiceGrpc;
import letterbox.v1.Letterbox.AckRequest;
import letterbox.v1.Letterbox.BrowseRequest;
import letterbox.v1.Letterbox.BrowseResponse;
import letterbox.v1.Letterbox.BrowsedMessage;
import letterbox.v1.Letterbox.CreateQueueRequest;
import letterbox.v1.Letterbox.DeadLetterPolicy;
import letterbox.v1.Letterbox.DeadLetterRecord;
import letterbox.v1.Letterbox.Delivery;
import letterbox.v1.Letterbox.ExtendItem;
import letterbox.v1.Letterbox.ExtendLeaseRequest;
import letterbox.v1.Letterbox.NackItem;
import letterbox.v1.Letterbox.NackRequest;
import letterbox.v1.Letterbox.PublishMessage;
import letterbox.v1.Letterbox.PublishRequest;
import letterbox.v1.Letterbox.PurgeQueueRequest;
import letterbox.v1.Letterbox.QueueConfig;
import letterbox.v1.Letterbox.ReceiveRequest;
import letterbox.v1.Letterbox.RedriveRequest;
import letterbox.v1.Letterbox.RedriveResponse;
import letterbox.v1.Letterbox.SettleResult;
import letterbox.v1.Letterbox.SettleStatus;
import letterbox.v1.MessagingServiceGrpc;

/**
 * A Letterbox consumer in Java, on grpc-java with the client that protoc and the grpc-java plugin
 * generate from the proto.
 *
 * <p>It runs a payment queue through an outage: the payment service is down, so each delivery is
 * nacked with the reason; after three deliveries the broker moves the message to the dead letter
 * queue. The consumer reads the dead-letter record there (Browse), the outage ends, it redrives the
 * message back and this time acks it. Every delivery's lease is extended before the work starts, as
 * a consumer does whose work may outlast the lease.
 *
 * <p>Run it from this directory against a server ({@code cargo run -- serve} at the repository
 * root): {@code mvn -q compile exec:java}.
 *
 * <p>Environment: LETTERBOX_ADDR (default 127.0.0.1:50051); LETTERBOX_TOKEN, a bearer token, for a
 * server with principals; LETTERBOX_CA_CERT, a PEM file, for a server with TLS (then give
 * LETTERBOX_ADDR the name its certificate carries, e.g. localhost:50051). It exits with 1 if the
 * broker does not behave as described.
 */
public final class Consume {
  static final String QUEUE = "example.payments";
  static final String DLQ = "example.payments.dlq";
  static final int MAX_DELIVERIES = 3;
  static final long RPC_TIMEOUT_S = 10; // every call has a deadline
  static final long LEASE_MS = 60_000; // what the work may take, asked for before it starts
  static final long PHASE_TIMEOUT_MS = 30_000; // the scenario's steps take well under a second

  /** The broker did not do what the example expects. */
  static final class Failed extends Exception {
    private static final long serialVersionUID = 1L;

    Failed(String message) {
      super(message);
    }
  }

  /** Stands in for what the handler calls; down until {@code up} is set. */
  static final class PaymentService {
    boolean up = false;

    void charge(byte[] body) throws IOException {
      if (!up) {
        throw new IOException("payment service unavailable");
      }
    }
  }

  static String when(long unixMs) {
    return DateTimeFormatter.ofPattern("HH:mm:ss.SSS")
        .withZone(ZoneOffset.UTC)
        .format(Instant.ofEpochMilli(unixMs));
  }

  private final AdminServiceGrpc.AdminServiceBlockingStub admin;
  private final MessagingServiceGrpc.MessagingServiceBlockingStub msg;
  final PaymentService payments = new PaymentService();
  final Set<String> acked = new HashSet<>();

  Consume(ManagedChannel channel, ClientInterceptor credentials) {
    // Stubs are cheap: both use the one channel. The interceptor adds the
    // credentials to every call.
    this.admin = AdminServiceGrpc.newBlockingStub(channel).withInterceptors(credentials);
    this.msg = MessagingServiceGrpc.newBlockingStub(channel).withInterceptors(credentials);
  }

  // Every call has a deadline, counted from when it is made.
  private AdminServiceGrpc.AdminServiceBlockingStub admin() {
    return admin.withDeadlineAfter(RPC_TIMEOUT_S, TimeUnit.SECONDS);
  }

  private MessagingServiceGrpc.MessagingServiceBlockingStub msg() {
    return msg.withDeadlineAfter(RPC_TIMEOUT_S, TimeUnit.SECONDS);
  }

  /** The DLQ first, then the queue that uses it; both emptied, so that a second run starts like the first. */
  void setup() {
    admin().createQueue(CreateQueueRequest.newBuilder().setName(DLQ).build());
    System.out.printf("queue %s ready%n", DLQ);
    QueueConfig config =
        QueueConfig.newBuilder()
            .setDeadLetter(
                DeadLetterPolicy.newBuilder().setQueue(DLQ).setMaxDeliveries(MAX_DELIVERIES))
            .build();
    admin().createQueue(CreateQueueRequest.newBuilder().setName(QUEUE).setConfig(config).build());
    System.out.printf(
        "queue %s ready (dead letters to %s after %d deliveries)%n", QUEUE, DLQ, MAX_DELIVERIES);
    for (String name : new String[] {QUEUE, DLQ}) {
      admin().purgeQueue(PurgeQueueRequest.newBuilder().setName(name).build());
    }
  }

  String publish(String body) {
    String id =
        msg()
            .publish(
                PublishRequest.newBuilder()
                    .setQueue(QUEUE)
                    .addMessages(
                        PublishMessage.newBuilder()
                            .setBody(ByteString.copyFromUtf8(body))
                            .putProperties("kind", "payment"))
                    .build())
            .getResults(0)
            .getMessageId();
    System.out.printf("published %s%n", id);
    return id;
  }

  /** One delivery: extend its lease, do the work, ack or nack. */
  void handle(Delivery d) throws Failed {
    SettleResult ext =
        msg()
            .extendLease(
                ExtendLeaseRequest.newBuilder()
                    .addItems(
                        ExtendItem.newBuilder().setAckToken(d.getAckToken()).setTimeoutMs(LEASE_MS))
                    .build())
            .getResults(0);
    if (ext.getStatus() != SettleStatus.SETTLE_STATUS_OK) {
      // The lease ran out before we got here: the message goes to another
      // consumer, this one must not work on it.
      System.out.printf(
          "delivery %d of %s: lease lost (%s)%n",
          d.getDeliveryCount(), d.getMessageId(), ext.getError());
      return;
    }
    String history =
        d.getDeadLettersCount() > 0
            ? String.format(" (dead-lettered %d time(s) before)", d.getDeadLettersCount())
            : "";
    String head =
        String.format(
            "delivery %d of %s%s: lease extended to %s",
            d.getDeliveryCount(), d.getMessageId(), history, when(ext.getLeaseDeadlineUnixMs()));
    try {
      payments.charge(d.getBody().toByteArray());
    } catch (IOException e) {
      SettleResult r =
          msg()
              .nack(
                  NackRequest.newBuilder()
                      .addItems(
                          NackItem.newBuilder()
                              .setAckToken(d.getAckToken())
                              .setReason(e.getMessage()))
                      .build())
              .getResults(0);
      if (r.getStatus() != SettleStatus.SETTLE_STATUS_OK) {
        throw new Failed("nack of " + d.getMessageId() + ": " + r.getError());
      }
      System.out.printf("%s, nacked: %s%n", head, e.getMessage());
      return;
    }
    SettleResult r =
        msg().ack(AckRequest.newBuilder().addAckTokens(d.getAckToken()).build()).getResults(0);
    if (r.getStatus() != SettleStatus.SETTLE_STATUS_OK) {
      // Acked too late (the lease ran out): it will come again.
      throw new Failed("ack of " + d.getMessageId() + ": " + r.getError());
    }
    acked.add(d.getMessageId());
    System.out.printf("%s, acked%n", head);
  }

  /** The consume loop: long-poll for up to 10 messages, handle each, until {@code until} is true. */
  void consume(BooleanSupplier until) throws Failed {
    long deadline = System.currentTimeMillis() + PHASE_TIMEOUT_MS;
    while (!until.getAsBoolean()) {
      if (System.currentTimeMillis() > deadline) {
        throw new Failed("not done after " + PHASE_TIMEOUT_MS / 1000 + " s");
      }
      ReceiveRequest request =
          ReceiveRequest.newBuilder().setQueue(QUEUE).setMaxMessages(10).setWaitMs(1000).build();
      for (Delivery d : msg().receive(request).getDeliveriesList()) {
        handle(d);
      }
    }
  }

  /** The message as the DLQ holds it, or null. Browse leases nothing and counts no delivery. */
  BrowsedMessage browseDlq(String messageId) {
    String pageToken = "";
    while (true) {
      BrowseResponse r =
          admin().browse(BrowseRequest.newBuilder().setQueue(DLQ).setPageToken(pageToken).build());
      for (BrowsedMessage m : r.getMessagesList()) {
        if (m.getMessageId().equals(messageId)) {
          return m;
        }
      }
      pageToken = r.getNextPageToken();
      if (pageToken.isEmpty()) {
        return null;
      }
    }
  }

  /**
   * Moves the message from the DLQ back to the queue it came from; the stream reports progress,
   * the last answer has {@code done}.
   */
  void redrive(String messageId) throws Failed {
    Iterator<RedriveResponse> stream =
        admin()
            .redrive(RedriveRequest.newBuilder().setQueue(DLQ).addMessageIds(messageId).build());
    RedriveResponse last = null;
    while (stream.hasNext()) {
      last = stream.next();
    }
    if (last == null || !last.getDone()) {
      throw new Failed("the redrive stream ended without done");
    }
    System.out.printf("redrive: moved %d of %d matched%n", last.getMoved(), last.getMatched());
    if (last.getMoved() != 1) {
      throw new Failed("redrive moved " + last.getMoved() + ", expected 1");
    }
  }

  static int run() throws IOException, InterruptedException {
    String addr = System.getenv().getOrDefault("LETTERBOX_ADDR", "127.0.0.1:50051");
    String token = System.getenv("LETTERBOX_TOKEN");
    String ca = System.getenv("LETTERBOX_CA_CERT");
    ChannelCredentials creds =
        ca == null
            ? InsecureChannelCredentials.create()
            : TlsChannelCredentials.newBuilder().trustManager(new File(ca)).build();
    Metadata headers = new Metadata();
    if (token != null) {
      headers.put(
          Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer " + token);
    }
    // One channel for the whole process: it multiplexes every call.
    ManagedChannel channel = Grpc.newChannelBuilder(addr, creds).build();
    try {
      Consume c = new Consume(channel, MetadataUtils.newAttachHeadersInterceptor(headers));
      c.setup();
      String messageId = c.publish("{\"invoice\": 42, \"amount\": \"99.00\"}");

      // The outage: every delivery fails until the broker gives up.
      c.consume(() -> c.browseDlq(messageId) != null);
      BrowsedMessage m = c.browseDlq(messageId);
      DeadLetterRecord rec = m.getDeadLetters(m.getDeadLettersCount() - 1);
      System.out.printf(
          "dead letter: %s from %s, reason %s after %d deliveries, last nack reason \"%s\", at %s%n",
          m.getMessageId(),
          rec.getSourceQueue(),
          rec.getReason().name().replaceFirst("^DEAD_LETTER_REASON_", ""),
          rec.getDeliveryCount(),
          rec.getLastNackReason(),
          when(rec.getAtUnixMs()));

      // The outage is over: take it back and handle it.
      c.payments.up = true;
      c.redrive(messageId);
      c.consume(() -> c.acked.contains(messageId));
    } catch (StatusRuntimeException e) {
      System.err.printf(
          "failed: %s: %s%n", e.getStatus().getCode(), e.getStatus().getDescription());
      return 1;
    } catch (Failed e) {
      System.err.printf("failed: %s%n", e.getMessage());
      return 1;
    } finally {
      channel.shutdown().awaitTermination(5, TimeUnit.SECONDS);
    }
    System.out.println("done");
    return 0;
  }

  public static void main(String[] args) throws Exception {
    System.exit(run());
  }
}
