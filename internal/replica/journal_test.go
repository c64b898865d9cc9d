package replica

import (
	"context"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

func ev(key string) lockfsm.Event { return lockfsm.Event{Kind: lockfsm.EventGranted, Key: key} }

// The journal answers what came after an index, for the watched keys
// only, in whole entries; it says when it no longer reaches back that
// far, after it dropped its oldest entries or loaded a snapshot.
func TestJournal(t *testing.T) {
	j := NewJournal(5)
	match := Match("{a}", true)
	j.add(1, []lockfsm.Event{ev("{a}x"), ev("b")})
	j.add(2, nil)
	j.add(3, []lockfsm.Event{ev("b")})
	j.add(4, []lockfsm.Event{ev("{a}y"), ev("{a}z")})
	bs, upTo, gone := j.Since(0, match, 1<<20)
	if gone || upTo != 4 || len(bs) != 2 || bs[0].Index != 1 || len(bs[0].Events) != 1 || bs[1].Index != 4 || len(bs[1].Events) != 2 {
		t.Fatalf("Since(0) = %+v, %d, %v", bs, upTo, gone)
	}
	// A limit cuts between entries, never inside one.
	one := EventSize(&lockfsm.Event{Key: "{a}x"})
	if bs, upTo, _ := j.Since(0, match, 2*one); len(bs) != 1 || upTo != 1 {
		t.Fatalf("Since(0) of at most 2 events = %+v up to %d, want entry 1 alone", bs, upTo)
	}
	if bs, upTo, _ := j.Since(1, match, one); len(bs) != 1 || bs[0].Index != 4 || upTo != 4 {
		t.Fatalf("Since(1) of at most 1 event = %+v up to %d, want all of entry 4", bs, upTo)
	}
	// Past 5 events the oldest entries go.
	j.add(5, []lockfsm.Event{ev("{a}x")})
	if _, _, gone := j.Since(0, match, 1<<20); !gone {
		t.Fatal("Since(0) after entry 1 was dropped: not gone")
	}
	if bs, _, gone := j.Since(1, match, 1<<20); gone || len(bs) != 2 {
		t.Fatalf("Since(1) = %+v, %v: entries 2 on are held", bs, gone)
	}
	j.reset(9)
	if _, _, gone := j.Since(5, match, 1<<20); !gone {
		t.Fatal("Since(5) after a snapshot at 9: not gone")
	}
	if bs, upTo, gone := j.Since(9, match, 1<<20); gone || len(bs) != 0 || upTo != 9 {
		t.Fatalf("Since(9) after a snapshot at 9 = %+v, %d, %v", bs, upTo, gone)
	}
	// Wait returns once an entry after the index is applied.
	done := make(chan error, 1)
	go func() { done <- j.Wait(context.Background(), 9) }()
	j.add(10, nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := j.Wait(ctx, 10); err == nil {
		t.Fatal("Wait for an entry that never came returned nil")
	}
}
