package router

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/transport"
)

// Trying a shard's hosts: every call this peer makes to "some peer hosting
// shard S" (a forwarded batch, a read, a keepalive, a membership change, a
// layout write or read) is the same loop: pick the hosts to try, try them
// in turn, decide from each failure whether to try the next, back off or
// stop, and when the context ends say what the last try hit. TryHosts is
// that loop; each caller brings its own order, call and verdicts.

// Step is what TryHosts does after a failed try.
type Step int

const (
	// NextHost records the error and tries the round's next host; after
	// the last one, the next round follows a backoff.
	NextHost Step = iota
	// NextRound records the error and drops the rest of the round: the
	// next round follows a backoff.
	NextRound
	// Skip tries the round's next host without recording the error: the
	// host did not count (no address, asked already).
	Skip
	// Stop ends TryHosts with the error as the try returned it.
	Stop
)

// NotLeaderError is a try's answer that Host does not lead the shard,
// naming the peer it believes does ("" or a peer outside the layout when
// it knows of none).
type NotLeaderError struct {
	Host, Leader string
}

func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("peer %s is not the leader (it names %q)", e.Host, e.Leader)
}

// Tries describes one "try this shard's hosts with backoff" loop for
// TryHosts. Its funcs run on the goroutine that called TryHosts, one at a
// time, so they may share state without locks.
type Tries struct {
	// Shard is the shard whose hosts are tried; followed hints are
	// recorded as its leader.
	Shard uint64
	// Hosts returns the peers to try in round (0, 1, ...), in order. It
	// is called at the start of every round, so it sees the leader cache
	// and the layout as the previous round left them.
	Hosts func(round int) []string
	// Call makes one try on host; nil ends TryHosts with success.
	Call func(ctx context.Context, host string) error
	// Judge says what a failed try means; nil judges every error
	// NextHost. It is not called for a hint that is followed.
	Judge func(host string, err error) Step
	// Rounds bounds the rounds; 0 means until ctx ends.
	Rounds int
	// FollowHints is how many rounds follow a not-leader hint: while
	// round < FollowHints, a *NotLeaderError naming a peer other than
	// the one tried records that peer as Shard's leader and starts the
	// next round at once, without a backoff.
	FollowHints int
	// MaxBackoff, when above 0, caps the attempt passed to Backoff.
	MaxBackoff int
	// NoneTried is what the loop fails with when no try was recorded; nil
	// means lockerr.NotReady.
	NoneTried error
	// Exhausted, when set, turns the last recorded error into the one
	// returned when the rounds run out; nil returns it as it is.
	Exhausted func(last error) error
}

// TryHosts runs t: round after round it calls t.Call on each of
// t.Hosts(round) in order until one succeeds, t.Judge says Stop or the
// round ends, backing off (Backoff, with the round as attempt) between
// rounds. It returns nil on success; the stopping error as it is; when
// t.Rounds run out, the last error recorded (through t.Exhausted); and
// when ctx ends or the router closes during a backoff, that error wrapped
// with the last error's text.
func (r *Router) TryHosts(ctx context.Context, t Tries) error {
	last := t.NoneTried
	if last == nil {
		last = lockerr.NotReady
	}
	for round := 0; t.Rounds == 0 || round < t.Rounds; round++ {
		followed := false
	hosts:
		for _, h := range t.Hosts(round) {
			err := t.Call(ctx, h)
			if err == nil {
				return nil
			}
			var nl *NotLeaderError
			if round < t.FollowHints && errors.As(err, &nl) && nl.Leader != h {
				r.SetLeader(t.Shard, nl.Leader)
				last, followed = err, true
				break
			}
			step := NextHost
			if t.Judge != nil {
				step = t.Judge(h, err)
			}
			switch step {
			case Stop:
				return err
			case Skip:
				continue
			case NextRound:
				last = err
				break hosts
			default:
				last = err
			}
		}
		if followed || (t.Rounds != 0 && round == t.Rounds-1) {
			continue
		}
		attempt := round
		if t.MaxBackoff > 0 {
			attempt = min(attempt, t.MaxBackoff)
		}
		if err := r.Backoff(ctx, attempt); err != nil {
			return fmt.Errorf("%w (last: %v)", err, last)
		}
	}
	if t.Exhausted != nil {
		return t.Exhausted(last)
	}
	return last
}

// CallHost sends a request to a peer hosting shard: the last known leader
// first, then the other replicas in turn, while the error is Retryable.
// It fails with lockerr.NotReady before the layout is known, and with an
// error wrapping transport.ErrUnavailable when no host answered.
func (r *Router) CallHost(ctx context.Context, shard uint64, method uint8, body []byte) ([]byte, error) {
	p := r.host.Placement()
	if p == nil {
		return nil, lockerr.NotReady
	}
	errNoAddr := errors.New("no address")
	var resp []byte
	err := r.TryHosts(ctx, Tries{
		Shard:  shard,
		Rounds: 1,
		Hosts: func(int) []string {
			hosts := p.HostNames(shard)
			if l := r.Leader(shard); l != "" {
				for i, h := range hosts {
					if h == l {
						hosts[0], hosts[i] = hosts[i], hosts[0]
					}
				}
			} else {
				rand.Shuffle(len(hosts), func(i, j int) { hosts[i], hosts[j] = hosts[j], hosts[i] })
			}
			return hosts
		},
		Call: func(ctx context.Context, h string) error {
			addr, ok := r.host.Addr(h)
			if !ok {
				return errNoAddr
			}
			raw, err := r.cfg.Peers.Call(ctx, addr, method, body)
			if err != nil {
				return fmt.Errorf("peer %s: %w", h, err)
			}
			r.SetLeader(shard, h)
			resp = raw
			return nil
		},
		Judge: func(h string, err error) Step {
			if err == errNoAddr {
				return Skip
			}
			r.ForgetLeader(shard, h)
			if !Retryable(err) || ctx.Err() != nil {
				return Stop
			}
			return NextHost
		},
		NoneTried: fmt.Errorf("no live peer hosts shard %d", shard),
		Exhausted: func(last error) error { return fmt.Errorf("%w: %w", transport.ErrUnavailable, last) },
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
