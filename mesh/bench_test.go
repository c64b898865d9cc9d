package mesh

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// BenchmarkEventQueuePush measures one push while OnEvent is blocked, as
// memberlist's goroutines see it when the user's callback is slow: a push
// only queues, whatever OnEvent does. The queue is replaced every 4096
// pushes, outside the timer, so the backlog stays small.
func BenchmarkEventQueuePush(b *testing.B) {
	const batch = 4096
	var q *eventQueue
	var release chan struct{}
	fresh := func() {
		r := make(chan struct{})
		release = r
		q = newEventQueue(func(Event) { <-r }, slog.New(slog.DiscardHandler))
	}
	drain := func() {
		close(release)
		q.close()
	}
	fresh()
	e := Event{Kind: EventUpdate, Member: Member{Name: "m"}}
	i := 0
	for b.Loop() {
		q.push(e)
		if i++; i%batch == 0 {
			b.StopTimer()
			drain()
			fresh()
			b.StartTimer()
		}
	}
	b.StopTimer()
	drain()
}

// BenchmarkJoinOverrun reports how long a Join that cannot reach anyone
// (nothing listens on port 1) runs past its context's deadline, in
// overrun-ms: its backoff waits must end with the context.
func BenchmarkJoinOverrun(b *testing.B) {
	m, err := Create(Config{Name: "joiner", BindAddr: "127.0.0.1:0", Meta: testMeta("joiner"), Local: true,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	var overrun time.Duration
	n := 0
	for b.Loop() {
		deadline := time.Now().Add(50 * time.Millisecond)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, _ = m.Join(ctx, []string{"127.0.0.1:1"})
		overrun += time.Since(deadline)
		cancel()
		n++
	}
	b.ReportMetric(float64(overrun.Microseconds())/1000/float64(n), "overrun-ms")
}
