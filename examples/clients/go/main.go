// A Letterbox consumer in Go, on grpc-go with the client that protoc-gen-go
// and protoc-gen-go-grpc generate from the proto.
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
// repository root), with protoc and the two plugins on PATH
// (docs/clients.md, "Go"):
//
//	mkdir -p gen
//	protoc -I ../../../proto \
//	  --go_out=gen --go_opt=paths=source_relative \
//	  --go_opt=Mletterbox/v1/letterbox.proto=example.com/letterbox-consume/gen/letterbox/v1 \
//	  --go-grpc_out=gen --go-grpc_opt=paths=source_relative \
//	  --go-grpc_opt=Mletterbox/v1/letterbox.proto=example.com/letterbox-consume/gen/letterbox/v1 \
//	  letterbox/v1/letterbox.proto
//	go mod tidy
//	go run .
//
// Environment: LETTERBOX_ADDR (default 127.0.0.1:50051); LETTERBOX_TOKEN, a
// bearer token, for a server with principals; LETTERBOX_CA_CERT, a PEM
// file, for a server with TLS (then give LETTERBOX_ADDR the name its
// certificate carries, e.g. localhost:50051). It exits with 1 if the broker
// does not behave as described.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	letterboxv1 "example.com/letterbox-consume/gen/letterbox/v1"
)

const (
	queue         = "example.payments"
	dlq           = "example.payments.dlq"
	maxDeliveries = 3
	rpcTimeout    = 10 * time.Second // every call has a deadline
	leaseMs       = 60_000           // what the work may take, asked for before it starts
	phaseTimeout  = 30 * time.Second // the scenario's steps take well under a second
)

// paymentService stands in for what the handler calls; down until up is set.
type paymentService struct{ up bool }

func (p *paymentService) charge(body []byte) error {
	if !p.up {
		return errors.New("payment service unavailable")
	}
	return nil
}

func when(unixMs uint64) string {
	return time.UnixMilli(int64(unixMs)).UTC().Format("15:04:05.000")
}

type consumer struct {
	admin    letterboxv1.AdminServiceClient
	msg      letterboxv1.MessagingServiceClient
	token    string // bearer token, sent on every call when set
	payments paymentService
	acked    map[string]bool
}

// ctx gives a call its deadline and credentials.
func (c *consumer) ctx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), rpcTimeout)
	if c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	return ctx, cancel
}

// setup creates the DLQ first, then the queue that uses it; both are
// emptied, so that a second run starts like the first.
func (c *consumer) setup() error {
	ctx, cancel := c.ctx()
	defer cancel()
	if _, err := c.admin.CreateQueue(ctx, &letterboxv1.CreateQueueRequest{Name: dlq}); err != nil {
		return err
	}
	fmt.Printf("queue %s ready\n", dlq)
	config := &letterboxv1.QueueConfig{
		DeadLetter: &letterboxv1.DeadLetterPolicy{Queue: dlq, MaxDeliveries: maxDeliveries},
	}
	if _, err := c.admin.CreateQueue(ctx, &letterboxv1.CreateQueueRequest{Name: queue, Config: config}); err != nil {
		return err
	}
	fmt.Printf("queue %s ready (dead letters to %s after %d deliveries)\n", queue, dlq, maxDeliveries)
	for _, name := range []string{queue, dlq} {
		if _, err := c.admin.PurgeQueue(ctx, &letterboxv1.PurgeQueueRequest{Name: name}); err != nil {
			return err
		}
	}
	return nil
}

func (c *consumer) publish(body []byte) (string, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.msg.Publish(ctx, &letterboxv1.PublishRequest{
		Queue: queue,
		Messages: []*letterboxv1.PublishMessage{
			{Body: body, Properties: map[string]string{"kind": "payment"}},
		},
	})
	if err != nil {
		return "", err
	}
	id := r.GetResults()[0].GetMessageId()
	fmt.Printf("published %s\n", id)
	return id, nil
}

// handle takes one delivery: extend its lease, do the work, ack or nack.
func (c *consumer) handle(d *letterboxv1.Delivery) error {
	ctx, cancel := c.ctx()
	defer cancel()
	ext, err := c.msg.ExtendLease(ctx, &letterboxv1.ExtendLeaseRequest{
		Items: []*letterboxv1.ExtendItem{{AckToken: d.GetAckToken(), TimeoutMs: leaseMs}},
	})
	if err != nil {
		return err
	}
	e := ext.GetResults()[0]
	if e.GetStatus() != letterboxv1.SettleStatus_SETTLE_STATUS_OK {
		// The lease ran out before we got here: the message goes to
		// another consumer, this one must not work on it.
		fmt.Printf("delivery %d of %s: lease lost (%s)\n", d.GetDeliveryCount(), d.GetMessageId(), e.GetError())
		return nil
	}
	history := ""
	if n := len(d.GetDeadLetters()); n > 0 {
		history = fmt.Sprintf(" (dead-lettered %d time(s) before)", n)
	}
	head := fmt.Sprintf("delivery %d of %s%s: lease extended to %s",
		d.GetDeliveryCount(), d.GetMessageId(), history, when(e.GetLeaseDeadlineUnixMs()))

	if failure := c.payments.charge(d.GetBody()); failure != nil {
		r, err := c.msg.Nack(ctx, &letterboxv1.NackRequest{
			Items: []*letterboxv1.NackItem{{AckToken: d.GetAckToken(), Reason: failure.Error()}},
		})
		if err != nil {
			return err
		}
		if s := r.GetResults()[0]; s.GetStatus() != letterboxv1.SettleStatus_SETTLE_STATUS_OK {
			return fmt.Errorf("nack of %s: %s", d.GetMessageId(), s.GetError())
		}
		fmt.Printf("%s, nacked: %s\n", head, failure)
		return nil
	}
	r, err := c.msg.Ack(ctx, &letterboxv1.AckRequest{AckTokens: []string{d.GetAckToken()}})
	if err != nil {
		return err
	}
	if s := r.GetResults()[0]; s.GetStatus() != letterboxv1.SettleStatus_SETTLE_STATUS_OK {
		// Acked too late (the lease ran out): it will come again.
		return fmt.Errorf("ack of %s: %s", d.GetMessageId(), s.GetError())
	}
	c.acked[d.GetMessageId()] = true
	fmt.Printf("%s, acked\n", head)
	return nil
}

// consume is the consume loop: long-poll for up to 10 messages, handle
// each, until until() is true.
func (c *consumer) consume(until func() (bool, error)) error {
	deadline := time.Now().Add(phaseTimeout)
	for {
		done, err := until()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %s", phaseTimeout)
		}
		ctx, cancel := c.ctx()
		r, err := c.msg.Receive(ctx, &letterboxv1.ReceiveRequest{Queue: queue, MaxMessages: 10, WaitMs: 1000})
		cancel()
		if err != nil {
			return err
		}
		for _, d := range r.GetDeliveries() {
			if err := c.handle(d); err != nil {
				return err
			}
		}
	}
}

// browseDLQ returns the message as the DLQ holds it, or nil. Browse leases
// nothing and counts no delivery.
func (c *consumer) browseDLQ(messageID string) (*letterboxv1.BrowsedMessage, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	pageToken := ""
	for {
		r, err := c.admin.Browse(ctx, &letterboxv1.BrowseRequest{Queue: dlq, PageToken: pageToken})
		if err != nil {
			return nil, err
		}
		for _, m := range r.GetMessages() {
			if m.GetMessageId() == messageID {
				return m, nil
			}
		}
		if pageToken = r.GetNextPageToken(); pageToken == "" {
			return nil, nil
		}
	}
}

// redrive moves the message from the DLQ back to the queue it came from;
// the stream reports progress, the last answer has Done.
func (c *consumer) redrive(messageID string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	stream, err := c.admin.Redrive(ctx, &letterboxv1.RedriveRequest{Queue: dlq, MessageIds: []string{messageID}})
	if err != nil {
		return err
	}
	var last *letterboxv1.RedriveResponse
	for {
		progress, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		last = progress
	}
	if !last.GetDone() {
		return errors.New("the redrive stream ended without done")
	}
	fmt.Printf("redrive: moved %d of %d matched\n", last.GetMoved(), last.GetMatched())
	if last.GetMoved() != 1 {
		return fmt.Errorf("redrive moved %d, expected 1", last.GetMoved())
	}
	return nil
}

func transport() (grpc.DialOption, error) {
	ca := os.Getenv("LETTERBOX_CA_CERT")
	if ca == "" {
		return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
	}
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", ca)
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})), nil
}

func run() error {
	addr := os.Getenv("LETTERBOX_ADDR")
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	creds, err := transport()
	if err != nil {
		return err
	}
	// One connection for the whole process, shared by both services' clients.
	conn, err := grpc.NewClient(addr, creds)
	if err != nil {
		return err
	}
	defer conn.Close()
	c := &consumer{
		admin: letterboxv1.NewAdminServiceClient(conn),
		msg:   letterboxv1.NewMessagingServiceClient(conn),
		token: os.Getenv("LETTERBOX_TOKEN"),
		acked: map[string]bool{},
	}
	if err := c.setup(); err != nil {
		return err
	}
	messageID, err := c.publish([]byte(`{"invoice": 42, "amount": "99.00"}`))
	if err != nil {
		return err
	}

	// The outage: every delivery fails until the broker gives up.
	inDLQ := func() (bool, error) {
		m, err := c.browseDLQ(messageID)
		return m != nil, err
	}
	if err := c.consume(inDLQ); err != nil {
		return err
	}
	m, err := c.browseDLQ(messageID)
	if err != nil {
		return err
	}
	rec := m.GetDeadLetters()[len(m.GetDeadLetters())-1]
	fmt.Printf("dead letter: %s from %s, reason %s after %d deliveries, last nack reason %q, at %s\n",
		m.GetMessageId(), rec.GetSourceQueue(),
		strings.TrimPrefix(rec.GetReason().String(), "DEAD_LETTER_REASON_"),
		rec.GetDeliveryCount(), rec.GetLastNackReason(), when(rec.GetAtUnixMs()))

	// The outage is over: take it back and handle it.
	c.payments.up = true
	if err := c.redrive(messageID); err != nil {
		return err
	}
	return c.consume(func() (bool, error) { return c.acked[messageID], nil })
}

func main() {
	if err := run(); err != nil {
		if s, ok := status.FromError(err); ok {
			fmt.Fprintf(os.Stderr, "failed: %s: %s\n", s.Code(), s.Message())
		} else {
			fmt.Fprintf(os.Stderr, "failed: %v\n", err)
		}
		os.Exit(1)
	}
	fmt.Println("done")
}
