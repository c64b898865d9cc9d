package transport_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport"
)

// A keepalive-sized request and response.
var benchBody = make([]byte, 32)

func BenchmarkCall(b *testing.B) {
	s := listen(b, transport.Config{}, echo)
	c := newClient(b, transport.Config{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Call(ctx, s.Addr(), 1, benchBody); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCallParallel(b *testing.B) {
	s := listen(b, transport.Config{}, echo)
	c := newClient(b, transport.Config{})
	ctx := context.Background()
	addr := s.Addr()
	b.ReportAllocs()
	b.SetParallelism(16) // many callers sharing one connection
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Call(ctx, addr, 1, benchBody); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkEncodeDecodeFrame(b *testing.B) {
	f := transport.Frame{Kind: transport.KindRequest, ID: 1 << 20, Method: 3, Payload: benchBody}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = transport.EncodeFrame(buf[:0], &f, 0)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := transport.DecodeFrame(buf[4:]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallDeadlineOverrun reports how long a call whose handler never
// answers runs past its context's deadline, in overrun-ms: the call must
// end with its context, not with the response.
func BenchmarkCallDeadlineOverrun(b *testing.B) {
	bl := newBlocker()
	s := listen(b, transport.Config{}, bl.handle)
	c := newClient(b, transport.Config{})
	var overrun time.Duration
	n := 0
	for b.Loop() {
		deadline := time.Now().Add(20 * time.Millisecond)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		if _, err := c.Call(ctx, s.Addr(), 1, nil); !errors.Is(err, context.DeadlineExceeded) {
			b.Fatalf("Call = %v, want context.DeadlineExceeded", err)
		}
		overrun += time.Since(deadline)
		cancel()
		n++
		for len(bl.started) > 0 {
			<-bl.started
		}
	}
	b.ReportMetric(float64(overrun.Microseconds())/1000/float64(n), "overrun-ms")
}
