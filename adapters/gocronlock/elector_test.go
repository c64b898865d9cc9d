package gocronlock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/adapters/gocronlock"
	"github.com/lockmesh/lockmesh/node"
)

// newElector starts an Elector, closed when the test ends.
func newElector(t testing.TB, s *node.Session, name, value string) *gocronlock.Elector {
	t.Helper()
	el, err := gocronlock.NewElector(context.Background(), s, name, []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { el.Close(context.Background()) })
	return el
}

// firstLeader waits until one of els leads, and returns its index and
// leadership.
func firstLeader(t testing.TB, ctx context.Context, els ...*gocronlock.Elector) (int, *node.Leadership) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	type won struct {
		i  int
		ld *node.Leadership
	}
	ch := make(chan won, len(els))
	var wg sync.WaitGroup
	for i, el := range els {
		wg.Go(func() {
			if ld, err := el.WaitLeader(ctx); err == nil {
				ch <- won{i, ld}
			}
		})
	}
	defer func() { cancel(); wg.Wait() }() // the losers' waits end
	select {
	case w := <-ch:
		return w.i, w.ld
	case <-ctx.Done():
		t.Fatal("nobody was elected in time")
		return -1, nil
	}
}

// Two Electors on two Sessions of one node: exactly one leads; when it
// closes, the other is elected in a later term.
func TestElectorOneLeaderThenHandover(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	els := []*gocronlock.Elector{
		newElector(t, newSession(t, n), "election/cron", "a"),
		newElector(t, newSession(t, n), "election/cron", "b"),
	}
	i, ld := firstLeader(t, ctx, els...)
	leader, other := els[i], els[1-i]
	if err := leader.IsLeader(ctx); err != nil {
		t.Fatalf("the leader's IsLeader: %v", err)
	}
	if err := other.IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) {
		t.Fatalf("the other's IsLeader: %v, want ErrNotLeader", err)
	}
	info, err := n.Leader(ctx, "election/cron")
	if want := []string{"a", "b"}[i]; err != nil || info.Term != ld.Term() || string(info.Value) != want {
		t.Fatalf("Leader = %+v, %v: want %s in term %d", info, err, want, ld.Term())
	}

	if err := leader.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := leader.IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) || !errors.Is(err, gocronlock.ErrElectorClosed) {
		t.Fatalf("IsLeader after Close: %v, want ErrNotLeader and ErrElectorClosed", err)
	}
	if !errors.Is(leader.Err(), gocronlock.ErrElectorClosed) {
		t.Fatalf("Err after Close: %v", leader.Err())
	}
	if !errors.Is(ld.Err(), node.ErrNotHeld) {
		t.Fatalf("the closed leader's leadership Err: %v, want node.ErrNotHeld (resigned)", ld.Err())
	}
	ld2, err := other.WaitLeader(ctx)
	if err != nil {
		t.Fatalf("the other was not elected after the leader closed: %v", err)
	}
	if ld2.Term() <= ld.Term() {
		t.Fatalf("the new term %d is not after the old %d", ld2.Term(), ld.Term())
	}
	if err := other.IsLeader(ctx); err != nil {
		t.Fatalf("the new leader's IsLeader: %v", err)
	}
	if err := leader.Close(ctx); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// A leader whose Session ends stops with the Session's error, and its
// leadership passes on.
func TestElectorSessionEnds(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	sessions := []*node.Session{newSession(t, n), newSession(t, n)}
	els := []*gocronlock.Elector{
		newElector(t, sessions[0], "election/cron", "a"),
		newElector(t, sessions[1], "election/cron", "b"),
	}
	i, ld := firstLeader(t, ctx, els...)
	if err := sessions[i].Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-els[i].Done():
	case <-ctx.Done():
		t.Fatal("the Elector did not stop after its Session closed")
	}
	if err := els[i].Err(); !errors.Is(err, node.ErrSessionClosed) {
		t.Fatalf("Err: %v, want node.ErrSessionClosed", err)
	}
	if err := els[i].IsLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) || !errors.Is(err, node.ErrSessionClosed) {
		t.Fatalf("IsLeader: %v, want ErrNotLeader wrapping node.ErrSessionClosed", err)
	}
	if _, err := els[i].WaitLeader(ctx); !errors.Is(err, gocronlock.ErrNotLeader) {
		t.Fatalf("WaitLeader of a stopped Elector: %v, want ErrNotLeader at once", err)
	}
	ld2, err := els[1-i].WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ld2.Term() <= ld.Term() {
		t.Fatalf("the new term %d is not after the old %d", ld2.Term(), ld.Term())
	}
}

// A candidate that closes withdraws; the leader leads on alone.
func TestElectorCloseWhileCampaigning(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	a := newElector(t, newSession(t, n), "election/cron", "a")
	if _, err := a.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	b := newElector(t, newSession(t, n), "election/cron", "b")
	err := b.IsLeader(ctx)
	if !errors.Is(err, gocronlock.ErrNotLeader) || !strings.Contains(err.Error(), "not elected yet") {
		t.Fatalf("a candidate's IsLeader: %v, want ErrNotLeader: not elected yet", err)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := n.Leader(ctx, "election/cron")
	if err != nil || string(info.Value) != "a" || info.Candidates != 0 {
		t.Fatalf("Leader = %+v, %v: want a, with no candidates left", info, err)
	}
	if err := a.IsLeader(ctx); err != nil {
		t.Fatal(err)
	}
}

// The context given to NewElector ends it as Close does.
func TestElectorContextEnds(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	ectx, cancel := context.WithCancel(ctx)
	el, err := gocronlock.NewElector(ectx, newSession(t, n), "election/cron", nil)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := el.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-el.Done():
	case <-ctx.Done():
		t.Fatal("the Elector did not stop with its context")
	}
	if err := el.Err(); !errors.Is(err, gocronlock.ErrElectorClosed) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Err: %v, want ErrElectorClosed wrapping context.Canceled", err)
	}
	if !errors.Is(ld.Err(), node.ErrNotHeld) {
		t.Fatalf("the leadership's Err: %v, want node.ErrNotHeld (resigned)", ld.Err())
	}
	if _, err := n.Leader(ctx, "election/cron"); !errors.Is(err, node.ErrNoLeader) {
		t.Fatalf("Leader after the only candidate stopped: %v, want node.ErrNoLeader", err)
	}
}

// NewElector refuses what could never be elected before it starts.
func TestNewElectorRefusesBadInput(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	s := newSession(t, n)
	if _, err := gocronlock.NewElector(ctx, s, "", nil); !errors.Is(err, node.ErrInvalidKey) {
		t.Fatalf("an empty name: %v, want node.ErrInvalidKey", err)
	}
	if _, err := gocronlock.NewElector(ctx, s, "election/cron", make([]byte, node.MaxValueLen+1)); !errors.Is(err, node.ErrInvalidArgument) {
		t.Fatalf("a value too long: %v, want node.ErrInvalidArgument", err)
	}
	closed := newSession(t, n)
	closed.Close(ctx)
	if _, err := gocronlock.NewElector(ctx, closed, "election/cron", nil); !errors.Is(err, node.ErrSessionClosed) {
		t.Fatalf("a closed Session: %v, want node.ErrSessionClosed", err)
	}
}
