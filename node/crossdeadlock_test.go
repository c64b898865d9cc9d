package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/peer"
)

// keysOnTwoShards returns two keys of prefix that live on different shards.
func keysOnTwoShards(t *testing.T, ctx context.Context, n *Node, prefix string) (string, string) {
	t.Helper()
	first, err := n.ShardOf(ctx, prefix+"-0")
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 1000; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if s, err := n.ShardOf(ctx, k); err == nil && s != first {
			return prefix + "-0", k
		}
	}
	t.Fatal("no two keys on different shards")
	return "", ""
}

// Two Sessions on two peers lock keys of two shards in opposite orders:
// no shard sees the cycle, the cross-shard check does, and refuses the
// wait of one of them (the higher Session ID) with ErrDeadlock naming the
// cycle; the other is granted once the refused one lets go. Run over
// several rounds, it logs the time from the cycle closing to the refusal.
func TestCrossShardDeadlockRefused(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, shards: 4, rf: 3, ttl: 5 * time.Second})
	a, b := peers[0].node, peers[1].node
	ctx := ctxT(t, 120*time.Second)
	const rounds = 5
	var took []time.Duration
	for round := range rounds {
		x, y := keysOnTwoShards(t, ctx, a, fmt.Sprintf("cross%d", round))
		sa, err := a.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sb, err := b.NewSession(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lx, err := sa.Lock(ctx, x)
		if err != nil {
			t.Fatal(err)
		}
		ly, err := sb.Lock(ctx, y)
		if err != nil {
			t.Fatal(err)
		}
		type outcome struct {
			who string
			err error
			at  time.Time
		}
		out := make(chan outcome, 2)
		wait := func(who string, s *Session, key string, held *Lock) {
			l, err := s.Lock(ctx, key)
			out <- outcome{who, err, time.Now()}
			if err != nil {
				// The refused one lets go, so the other is granted.
				_ = held.Unlock(ctx)
				return
			}
			_ = l.Unlock(ctx)
			_ = held.Unlock(ctx)
		}
		go wait("a", sa, y, lx)
		waitFor(t, "a to wait for "+y, func() bool {
			info, err := a.Inspect(ctx, y)
			return err == nil && len(info.Waiters) == 1
		})
		go wait("b", sb, x, ly)
		waitFor(t, "b to wait for "+x, func() bool {
			info, err := a.Inspect(ctx, x)
			return err == nil && len(info.Waiters) == 1
		})
		closed := time.Now()
		first, second := <-out, <-out
		if first.err == nil || !errors.Is(first.err, ErrDeadlock) {
			t.Fatalf("round %d: first outcome %s: %v, want ErrDeadlock", round, first.who, first.err)
		}
		if second.err != nil {
			t.Fatalf("round %d: the other wait (%s): %v, want granted once the victim let go", round, second.who, second.err)
		}
		victim := map[string]*Session{"a": sa, "b": sb}[first.who]
		other := map[string]*Session{"a": sb, "b": sa}[first.who]
		if victim.ID() < other.ID() {
			t.Errorf("round %d: refused session %d, the lower ID of the cycle (%d)", round, victim.ID(), other.ID())
		}
		msg := first.err.Error()
		if !strings.Contains(msg, "across shards") || !strings.Contains(msg, fmt.Sprintf("session %d", sa.ID())) || !strings.Contains(msg, fmt.Sprintf("session %d", sb.ID())) {
			t.Errorf("round %d: refusal %q does not name the cycle's sessions", round, msg)
		}
		took = append(took, first.at.Sub(closed))
		_ = sa.Close(ctx)
		_ = sb.Close(ctx)
	}
	slices.Sort(took)
	t.Logf("cross-shard deadlock refused after: median %v, worst %v, over %d rounds (probe %v)",
		took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), rounds, peer.DeadlockProbe)
}

// The default session (Node.Lock) is never checked, and a wait that some
// release ends is not refused: a Session waiting across shards for a key
// whose holder waits for nothing is granted when the holder lets go.
func TestCrossShardWaitWithoutCycleIsNotRefused(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, shards: 4, rf: 3, ttl: 5 * time.Second})
	a, b := peers[0].node, peers[1].node
	ctx := ctxT(t, 60*time.Second)
	x, y := keysOnTwoShards(t, ctx, a, "nocycle")
	sa, err := a.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sa.Lock(ctx, x); err != nil {
		t.Fatal(err)
	}
	ly, err := sb.Lock(ctx, y)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := sa.Lock(ctx, y)
		if l != nil {
			_ = l.Unlock(ctx)
		}
		got <- err
	}()
	waitFor(t, "a to wait for "+y, func() bool {
		info, err := a.Inspect(ctx, y)
		return err == nil && len(info.Waiters) == 1
	})
	// Several probes go by with a's wait old enough to be checked.
	probes := a.peer.DeadlockChecks()
	waitFor(t, "three cross-shard checks of a's wait", func() bool { return a.peer.DeadlockChecks() >= probes+3 })
	select {
	case err := <-got:
		t.Fatalf("a's wait ended before b let go: %v", err)
	default:
	}
	if err := ly.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("a's wait: %v, want granted", err)
	}
}
