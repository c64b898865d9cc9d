package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/transport"
)

// hostLog records the tries TryHosts makes, one line per round.
type hostLog struct {
	rounds [][]string
	starts []time.Time
}

func (l *hostLog) hosts(names ...string) func(int) []string {
	return func(int) []string {
		l.rounds = append(l.rounds, nil)
		l.starts = append(l.starts, time.Now())
		return names
	}
}

func (l *hostLog) call(f func(host string) error) func(context.Context, string) error {
	return func(_ context.Context, h string) error {
		l.rounds[len(l.rounds)-1] = append(l.rounds[len(l.rounds)-1], h)
		return f(h)
	}
}

// Each round tries its hosts in the order given, NextRound drops the rest
// of a round, Skip leaves no trace in the error, and when the rounds run
// out the last error recorded is returned through Exhausted.
func TestTryHostsOrderAndRounds(t *testing.T) {
	r := newTestRouter(t, &fakeHost{p: threePeers()}, nil)
	var l hostLog
	err := r.TryHosts(context.Background(), Tries{
		Shard:  shard,
		Rounds: 3,
		Hosts:  l.hosts("x", "a", "b", "c"),
		Call:   l.call(func(h string) error { return fmt.Errorf("peer %s down", h) }),
		Judge: func(h string, err error) Step {
			switch h {
			case "x":
				return Skip
			case "b":
				return NextRound
			}
			return NextHost
		},
		Exhausted: func(last error) error { return fmt.Errorf("gave up: %w", last) },
	})
	want := [][]string{{"x", "a", "b"}, {"x", "a", "b"}, {"x", "a", "b"}}
	if !slices.EqualFunc(l.rounds, want, slices.Equal) {
		t.Fatalf("tries %v, want %v", l.rounds, want)
	}
	if err == nil || err.Error() != "gave up: peer b down" {
		t.Fatalf("TryHosts = %v, want the last recorded error (b's) through Exhausted", err)
	}

	// Only skipped hosts: the error is NoneTried.
	none := errors.New("no host")
	err = r.TryHosts(context.Background(), Tries{
		Rounds: 1, Hosts: func(int) []string { return []string{"a"} },
		Call:  func(context.Context, string) error { return errors.New("skipped") },
		Judge: func(string, error) Step { return Skip }, NoneTried: none,
	})
	if err != none {
		t.Fatalf("TryHosts with every host skipped = %v, want NoneTried", err)
	}
}

// A Stop verdict ends the loop at once with the try's error unchanged; a
// success ends it with nil.
func TestTryHostsStopsOnAVerdict(t *testing.T) {
	r := newTestRouter(t, &fakeHost{p: threePeers()}, nil)
	rejected := lockerr.RPC(lockerr.CodeRejected, "no")
	var l hostLog
	err := r.TryHosts(context.Background(), Tries{
		Hosts: l.hosts("a", "b", "c"),
		Call: l.call(func(h string) error {
			if h == "b" {
				return rejected
			}
			return transport.ErrUnavailable
		}),
		Judge: func(_ string, err error) Step {
			if lockerr.Code(err) == lockerr.CodeRejected {
				return Stop
			}
			return NextHost
		},
	})
	if err != rejected || !slices.EqualFunc(l.rounds, [][]string{{"a", "b"}}, slices.Equal) {
		t.Fatalf("TryHosts = %v after %v, want the rejection after a, b", err, l.rounds)
	}
	l = hostLog{}
	err = r.TryHosts(context.Background(), Tries{
		Hosts: l.hosts("a", "b", "c"),
		Call: l.call(func(h string) error {
			if h == "b" {
				return nil
			}
			return transport.ErrUnavailable
		}),
	})
	if err != nil || !slices.EqualFunc(l.rounds, [][]string{{"a", "b"}}, slices.Equal) {
		t.Fatalf("TryHosts = %v after %v, want success at b", err, l.rounds)
	}
}

// A not-leader hint is recorded as the shard's leader and the next round
// starts at once, only during the first FollowHints rounds; a hint naming
// the peer asked is not followed.
func TestTryHostsFollowsLeaderHints(t *testing.T) {
	// An RTT of an hour: a backoff would outlive the test.
	h := &fakeHost{p: threePeers()}
	r := New(Config{Name: "a", RTT: time.Hour, Peers: &fakePeers{}}, h)
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var tried []string
	hints := map[string]string{"a": "b", "b": "c", "c": "a"}
	err := r.TryHosts(ctx, Tries{
		Shard:       shard,
		FollowHints: 3,
		Hosts: func(int) []string {
			if l := r.Leader(shard); l != "" {
				return []string{l}
			}
			return []string{"a"}
		},
		Call: func(_ context.Context, host string) error {
			tried = append(tried, host)
			if len(tried) == 4 {
				return nil
			}
			return &NotLeaderError{Host: host, Leader: hints[host]}
		},
	})
	if err != nil || !slices.Equal(tried, []string{"a", "b", "c", "a"}) {
		t.Fatalf("TryHosts = %v after %v, want each hint followed without a backoff: a b c a", err, tried)
	}
	if got := r.Leader(shard); got != "a" {
		t.Fatalf("leader = %q, want a, the last hint", got)
	}

	// Past FollowHints rounds, or naming the peer asked, a hint is an
	// ordinary failure: judged, and a backoff follows.
	for _, tc := range []struct {
		name   string
		follow int
		hint   string
	}{{"rounds spent", 0, "b"}, {"names itself", 3, "a"}} {
		r.ForgetLeader(shard, r.Leader(shard))
		judged := 0
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := r.TryHosts(ctx, Tries{
			Shard: shard, FollowHints: tc.follow,
			Hosts: func(int) []string { return []string{"a"} },
			Call: func(context.Context, string) error {
				return &NotLeaderError{Host: "a", Leader: tc.hint}
			},
			Judge: func(string, error) Step { judged++; return NextRound },
		})
		cancel()
		if judged != 1 || !errors.Is(err, context.DeadlineExceeded) || r.Leader(shard) != "" {
			t.Fatalf("%s: TryHosts = %v, judged %d, leader %q; want one judged try, then the backoff cut by ctx",
				tc.name, err, judged, r.Leader(shard))
		}
	}
}

// Rounds are separated by Backoff (at least half the RTT after the first
// round), capped by MaxBackoff.
func TestTryHostsBacksOffBetweenRounds(t *testing.T) {
	const rtt = 20 * time.Millisecond
	r := New(Config{Name: "a", RTT: rtt, Peers: &fakePeers{}}, &fakeHost{p: threePeers()})
	defer r.Close()
	var l hostLog
	err := r.TryHosts(context.Background(), Tries{
		Rounds: 4, MaxBackoff: 1,
		Hosts: l.hosts("a", "b"),
		Call:  l.call(func(string) error { return transport.ErrUnavailable }),
	})
	if !errors.Is(err, transport.ErrUnavailable) || len(l.rounds) != 4 {
		t.Fatalf("TryHosts = %v after %d rounds, want the last error after 4", err, len(l.rounds))
	}
	// Backoff(attempt) sleeps between rtt<<attempt/2 and rtt<<attempt;
	// the cap keeps rounds 2 and 3 at attempt 1.
	for i := 1; i < len(l.starts); i++ {
		gap := l.starts[i].Sub(l.starts[i-1])
		if lo := (rtt << min(i-1, 1)) / 2; gap < lo {
			t.Fatalf("round %d started %v after round %d, want a backoff of at least %v", i, gap, i-1, lo)
		}
	}
}

// When ctx ends during a backoff, the error wraps ctx's and names the last
// error seen; after Close it is lockerr.Closed.
func TestTryHostsGivesUpNamingTheLastError(t *testing.T) {
	r := newTestRouter(t, &fakeHost{p: threePeers()}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	tries := 0
	err := r.TryHosts(ctx, Tries{
		Hosts: func(int) []string { return []string{"a", "b"} },
		Call: func(_ context.Context, h string) error {
			tries++
			return fmt.Errorf("peer %s: try %d failed", h, tries)
		},
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), fmt.Sprintf("try %d failed", tries)) {
		t.Fatalf("TryHosts = %v, want the deadline naming the last try (%d)", err, tries)
	}
	if tries < 4 {
		t.Fatalf("%d tries in 50ms at a 1ms RTT, want several rounds", tries)
	}

	r.Close()
	err = r.TryHosts(context.Background(), Tries{
		Hosts: func(int) []string { return []string{"a"} },
		Call:  func(context.Context, string) error { return transport.ErrUnavailable },
	})
	if !errors.Is(err, lockerr.Closed) {
		t.Fatalf("TryHosts after Close = %v, want Closed", err)
	}
}

// CallHost tries the known leader first, then the other hosts; it
// stops at an error that is not Retryable and says Unavailable, naming the
// last peer's error, when no host answered.
func TestCallHost(t *testing.T) {
	p := threePeers()
	peers := &fakePeers{f: func(addr string, _ []byte) ([]byte, error) {
		return nil, fmt.Errorf("dial %s: %w", addr, transport.ErrUnavailable)
	}}
	r := newTestRouter(t, &fakeHost{p: p}, peers)
	r.SetLeader(shard, "c")
	_, err := r.CallHost(context.Background(), shard, 1, nil)
	if calls := peers.called(); len(calls) != 3 || calls[0] != "addr-c" {
		t.Fatalf("calls %v, want the leader c first, then the other two", calls)
	}
	if !errors.Is(err, transport.ErrUnavailable) || !strings.Contains(err.Error(), "peer ") {
		t.Fatalf("CallHost = %v, want Unavailable naming the last peer", err)
	}
	if r.Leader(shard) != "" {
		t.Fatalf("leader %q kept after it failed", r.Leader(shard))
	}

	refused := errors.New("refused")
	peers.calls = nil
	peers.f = func(string, []byte) ([]byte, error) { return nil, refused }
	if _, err := r.CallHost(context.Background(), shard, 1, nil); !errors.Is(err, refused) || errors.Is(err, transport.ErrUnavailable) || len(peers.called()) != 1 {
		t.Fatalf("CallHost = %v after %v, want the refusal after one call", err, peers.called())
	}

	peers.calls = nil
	peers.f = func(addr string, _ []byte) ([]byte, error) {
		if addr == "addr-b" {
			return []byte("ok"), nil
		}
		return nil, transport.ErrUnavailable
	}
	r.SetLeader(shard, "b")
	if resp, err := r.CallHost(context.Background(), shard, 1, nil); err != nil || string(resp) != "ok" || len(peers.called()) != 1 {
		t.Fatalf("CallHost = %q, %v after %v, want b's answer at once", resp, err, peers.called())
	}
	if r.Leader(shard) != "b" {
		t.Fatalf("leader %q after b answered, want b", r.Leader(shard))
	}
}
