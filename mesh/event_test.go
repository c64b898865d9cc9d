package mesh

import (
	"log/slog"
	"testing"
	"time"
)

// A blocked OnEvent must not block memberlist: every push returns while
// OnEvent is still blocked, and events come out in order once it resumes.
// How fast a push is, is BenchmarkEventQueuePush's to say.
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
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		for i := range 5000 {
			q.push(Event{Kind: EventUpdate, Member: Member{Meta: Meta{Cluster: uint64(i)}}})
		}
	}()
	// OnEvent stays blocked until every push has returned: a push that
	// waited for it would never return.
	select {
	case <-pushed:
	case <-time.After(30 * time.Second):
		t.Fatal("5000 pushes did not return within 30s while OnEvent was blocked: push waits for OnEvent")
	}
	close(release)
	select {
	case <-got:
	case <-time.After(30 * time.Second):
		t.Fatal("not every event was delivered 30s after OnEvent resumed")
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
