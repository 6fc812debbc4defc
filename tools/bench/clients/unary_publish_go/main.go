// Unary Publish from Go, as a user writes it with the client that
// protoc-gen-go and protoc-gen-go-grpc generate from the proto.
//
// One unary Publish of one 1 KiB message per call, -window calls in flight
// (one goroutine each), spread over -channels client connections in turn;
// or, with -stream, one PublishStream with -window requests unanswered.
// Prints one line: messages, seconds, msg/s. The queue must exist
// (`letterbox queue create bench`); against tonic-floor any name does.
//
// Built offline from Debian's Go packages by tools/bench/clients/unary-publish-go.sh
// (which generates the client into a scratch GOPATH), or with modules as the
// Go consumer example is (docs/clients.md, "Go").
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	pb "letterbox/v1"

	"google.golang.org/grpc"
)

func main() {
	target := flag.String("target", "127.0.0.1:50051", "server address")
	queue := flag.String("queue", "bench", "queue to publish to")
	window := flag.Int("window", 64, "calls (or stream requests) in flight")
	count := flag.Int("count", 20000, "messages to publish")
	channels := flag.Int("channels", 1, "client connections, used in turn")
	stream := flag.Bool("stream", false, "one PublishStream instead of unary calls")
	flag.Parse()
	if *window < 1 || *count < 1 || *channels < 1 {
		log.Fatalf("window (%d), count (%d) and channels (%d) must be at least 1", *window, *count, *channels)
	}
	body := make([]byte, 1024)
	for i := range body {
		body[i] = 'x'
	}
	conns := make([]*grpc.ClientConn, *channels)
	stubs := make([]pb.MessagingServiceClient, *channels)
	for i := range conns {
		c, err := grpc.Dial(*target, grpc.WithInsecure())
		if err != nil {
			log.Fatalf("dial %s: %v", *target, err)
		}
		conns[i] = c
		stubs[i] = pb.NewMessagingServiceClient(c)
	}
	ctx := context.Background()
	started := time.Now()
	var n int64
	var err error
	if *stream {
		n, err = publishStream(ctx, stubs[0], *queue, body, *window, *count)
	} else {
		n, err = unary(ctx, stubs, *queue, body, *window, *count)
	}
	took := time.Since(started).Seconds()
	if err != nil {
		log.Printf("after %d messages: %v", n, err)
		os.Exit(1)
	}
	mode := fmt.Sprintf("unary channels=%d", *channels)
	if *stream {
		mode = "stream"
	}
	fmt.Printf("go %s window=%d: %d msgs in %.2fs = %.0f msg/s\n", mode, *window, n, took, float64(n)/took)
	for _, c := range conns {
		c.Close()
	}
}

// unary runs window goroutines, each publishing one message per call until
// count calls have been made, goroutine g on connection g % len(stubs).
func unary(ctx context.Context, stubs []pb.MessagingServiceClient, queue string, body []byte, window, count int) (int64, error) {
	var next, done int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for g := 0; g < window; g++ {
		wg.Add(1)
		go func(stub pb.MessagingServiceClient) {
			defer wg.Done()
			for atomic.AddInt64(&next, 1) <= int64(count) {
				r, err := stub.Publish(ctx, &pb.PublishRequest{
					Queue:    queue,
					Messages: []*pb.PublishMessage{{Body: body}},
				})
				if err == nil && len(r.Results) != 1 {
					err = fmt.Errorf("%d results for one message", len(r.Results))
				}
				if err != nil {
					once.Do(func() { first = err })
					return
				}
				atomic.AddInt64(&done, 1)
			}
		}(stubs[g%len(stubs)])
	}
	wg.Wait()
	return done, first
}

// publishStream sends count requests on one PublishStream, at most window
// of them unanswered, and counts the answers.
func publishStream(ctx context.Context, stub pb.MessagingServiceClient, queue string, body []byte, window, count int) (int64, error) {
	s, err := stub.PublishStream(ctx)
	if err != nil {
		return 0, err
	}
	credit := make(chan struct{}, window)
	for i := 0; i < window; i++ {
		credit <- struct{}{}
	}
	sendErr := make(chan error, 1)
	go func() {
		for i := 0; i < count; i++ {
			<-credit
			if err := s.Send(&pb.PublishStreamRequest{
				Sequence: uint64(i),
				Publish: &pb.PublishRequest{
					Queue:    queue,
					Messages: []*pb.PublishMessage{{Body: body}},
				},
			}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- s.CloseSend()
	}()
	var done int64
	for done < int64(count) {
		r, err := s.Recv()
		if err != nil {
			return done, err
		}
		if r.Code != 0 {
			return done, fmt.Errorf("publish %d: %d %s", r.Sequence, r.Code, r.Error)
		}
		done++
		credit <- struct{}{}
	}
	return done, <-sendErr
}
