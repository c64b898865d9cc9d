package mesh

import (
	"log/slog"
	"testing"
	"time"
)

// A blocked OnEvent must not block memberlist: push returns at once and
// events come out in order once OnEvent resumes.
func TestEventQueueNeverBlocks(t *testing.T) {
	release := make(chan struct{})
	got := make(chan Event, 1)
	var seen []int
	q := newEventQueue(func(e Event) {
		<-release
		seen = append(seen, int(e.Member.Meta.Cluster))
		if len(seen) == 5000 {
			got <- e
		}
	}, slog.New(slog.DiscardHandler))
	start := time.Now()
	for i := range 5000 {
		q.push(Event{Kind: EventUpdate, Member: Member{Meta: Meta{Cluster: uint64(i)}}})
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("pushing 5000 events with OnEvent blocked took %v", d)
	}
	close(release)
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatalf("only %d events delivered", len(seen))
	}
	q.close()
	for i, v := range seen {
		if v != i {
			t.Fatalf("event %d delivered as %d: out of order", i, v)
		}
	}
	q.push(Event{}) // after close: dropped, no panic
}

// close waits for an OnEvent call in progress and drops the backlog.
func TestEventQueueCloseWaits(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	calls := 0
	q := newEventQueue(func(Event) {
		calls++
		if calls == 1 {
			close(entered)
			<-release
		}
	}, slog.New(slog.DiscardHandler))
	q.push(Event{})
	q.push(Event{})
	<-entered
	closed := make(chan struct{})
	go func() { q.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("close returned while OnEvent was running")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-closed
	if calls != 1 {
		t.Fatalf("OnEvent called %d times after close, want 1", calls)
	}
}

func TestStateAndKindStrings(t *testing.T) {
	for s, want := range map[State]string{StateAlive: "alive", StateSuspect: "suspect", StateDead: "dead", StateLeft: "left", 9: "unknown"} {
		if s.String() != want {
			t.Errorf("State(%d) = %q, want %q", s, s.String(), want)
		}
	}
	for k, want := range map[EventKind]string{EventJoin: "join", EventLeave: "leave", EventUpdate: "update", 0: "unknown"} {
		if k.String() != want {
			t.Errorf("EventKind(%d) = %q, want %q", k, k.String(), want)
		}
	}
}
