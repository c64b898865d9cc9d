package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/node"
)

var (
	// ErrNotLeader wraps IsLeader's and Leadership's errors: this instance
	// does not lead the election now. The error says why: not elected yet
	// (and what the last campaign met, if it failed), the leadership lost
	// (wrapping the leadership's Err, e.g. node.ErrLeaseExpired), or the
	// Elector stopped.
	ErrNotLeader = errors.New("gocronlock: not the leader")
	// ErrElectorClosed is Elector.Err's error after Close, or after the
	// context given to NewElector ended (then it wraps the context's
	// cause too).
	ErrElectorClosed = errors.New("gocronlock: elector closed")
)

// The bounds of the wait between campaigns that failed for a reason that
// may pass (the shard unavailable, the cluster below feature level 4).
const (
	minRetry = 50 * time.Millisecond
	maxRetry = 5 * time.Second
)

// resignBound is how long Close waits for the resignation to commit.
const resignBound = 10 * time.Second

// Elector is a gocron.Elector that campaigns in a lockmesh election in
// the background, and campaigns again each time it loses the leadership,
// until it is closed. Make one with NewElector; it is safe for concurrent
// use.
type Elector struct {
	s     *node.Session
	e     *node.Election
	value []byte

	cancel context.CancelCauseFunc
	done   chan struct{}

	mu       sync.Mutex
	ld       *node.Leadership // the leadership won, nil while campaigning
	why      error            // why it does not lead, wrapping ErrNotLeader
	err      error            // why it stopped; nil while it runs
	closeErr error            // the resignation's, when it stopped leading
	changed  chan struct{}    // closed and replaced at every change
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector starts campaigning through s in the election called name,
// proclaiming value (at most node.MaxValueLen bytes; nil for none), and
// returns the Elector for gocron.WithDistributedElector. Give every
// instance that schedules the same jobs the same name, and the election a
// name of its own: an election and a lock of the same name are the same
// key.
//
// It campaigns until ctx ends or Close is called, and campaigns again
// each time the leadership is lost while s lives. Campaigns that fail for
// a reason that may pass (the shard unavailable, the cluster not yet at
// feature level 4 during an upgrade) are retried, waiting 50 ms, then
// longer, up to 5 s; IsLeader's error says what they met. The Elector
// stops for good when s ends (lost or closed) or its node closes: Done
// closes and Err says why; start a new Session and Elector then. Use one
// Elector per Session and name: a Session campaigns in an election once
// at a time.
//
// It fails at once, and starts nothing, for an invalid name or value or
// a Session that has ended.
func NewElector(ctx context.Context, s *node.Session, name string, value []byte) (*Elector, error) {
	if err := lockfsm.ValidateKey(name); err != nil {
		return nil, fmt.Errorf("gocronlock: %w: election name: %v", node.ErrInvalidKey, err)
	}
	if len(value) > node.MaxValueLen {
		return nil, fmt.Errorf("gocronlock: %w: a value of %d bytes, longer than node.MaxValueLen (%d)", node.ErrInvalidArgument, len(value), node.MaxValueLen)
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("gocronlock: campaign in %q: the session ended: %w", name, err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	el := &Elector{
		s:       s,
		e:       s.Election(name),
		value:   slices.Clone(value),
		cancel:  cancel,
		done:    make(chan struct{}),
		why:     fmt.Errorf("%w: not elected yet in %q", ErrNotLeader, name),
		changed: make(chan struct{}),
	}
	go el.run(ctx)
	return el, nil
}

// Election returns the election the Elector campaigns in.
func (el *Elector) Election() *node.Election { return el.e }

// IsLeader returns nil while this instance leads the election, and
// otherwise an error wrapping ErrNotLeader that says why. gocron calls it
// before each run of each job, and runs the job only when it returns nil.
//
// It does no I/O, and ctx is not used: it reads the leadership's Err,
// which checks the lease against the clock, so an instance paused past
// its lease is never told it leads. It answers for this moment only: a
// job that starts just before the leadership ends still runs while the
// next leader runs its own. Pass the term to what the job writes to (see
// Leadership).
func (el *Elector) IsLeader(ctx context.Context) error {
	_, err := el.Leadership()
	return err
}

// Leadership returns the leadership this instance holds now, or an error
// wrapping ErrNotLeader, as IsLeader. A job reads it to fence its writes
// on the term, and to stop when the leadership ends:
//
//	ld, err := el.Leadership()
//	if err != nil {
//		return err // the leadership ended since gocron asked
//	}
//	ctx := ld.Context(context.Background()) // cancelled when it ends
//	return store.Write(ctx, ld.Term(), data)  // store refuses older terms
func (el *Elector) Leadership() (*node.Leadership, error) {
	el.mu.Lock()
	ld, why := el.ld, el.why
	el.mu.Unlock()
	if ld == nil {
		return nil, why
	}
	if err := ld.Err(); err != nil {
		return nil, fmt.Errorf("%w: the leadership of %q (term %d) ended: %w", ErrNotLeader, el.e.Name(), ld.Term(), err)
	}
	return ld, nil
}

// WaitLeader waits until this instance leads the election and returns its
// leadership, or returns an error when ctx ends first (ctx's error) or the
// Elector stops (wrapping ErrNotLeader and why it stopped).
func (el *Elector) WaitLeader(ctx context.Context) (*node.Leadership, error) {
	for {
		el.mu.Lock()
		ch, stopped := el.changed, el.err != nil
		el.mu.Unlock()
		ld, err := el.Leadership()
		if err == nil || stopped {
			return ld, err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Done is closed when the Elector has stopped: closed, its context ended,
// its Session ended or its node closed. Err says why.
func (el *Elector) Done() <-chan struct{} { return el.done }

// Err returns nil while the Elector runs, then why it stopped: an error
// wrapping ErrElectorClosed after Close or the end of NewElector's
// context, else the error that ended the campaign (wrapping, say,
// node.ErrLeaseExpired or node.ErrSessionClosed for a Session that ended,
// or node.ErrClosed).
func (el *Elector) Err() error {
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.err
}

// Close stops campaigning and resigns the leadership if this instance
// leads, which elects the next candidate at once, and waits until the
// Elector has stopped or ctx ends. It returns the resignation's error, if
// it did not commit within 10 s (it goes on in the background, and the
// cluster frees the election when the Session's TTL runs out at the
// latest), or ctx's error. It does not close the Session. Close is
// idempotent.
func (el *Elector) Close(ctx context.Context) error {
	el.cancel(ErrElectorClosed)
	select {
	case <-el.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	el.mu.Lock()
	defer el.mu.Unlock()
	return el.closeErr
}

// run campaigns until ctx ends or the campaign cannot go on.
func (el *Elector) run(ctx context.Context) {
	defer close(el.done)
	name := el.e.Name()
	delay := minRetry
	for {
		ld, err := el.e.Campaign(ctx, el.value)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				el.stop(stopped(ctx), nil)
				return
			case el.s.Err() != nil:
				el.stop(fmt.Errorf("gocronlock: campaign in %q: the session ended: %w", name, el.s.Err()), nil)
				return
			case errors.Is(err, node.ErrClosed), errors.Is(err, node.ErrInvalidKey), errors.Is(err, node.ErrInvalidArgument):
				el.stop(fmt.Errorf("gocronlock: %w", err), nil)
				return
			}
			el.set(nil, fmt.Errorf("%w: not elected yet in %q; the last campaign failed: %w", ErrNotLeader, name, err))
			if errors.Is(err, node.ErrLeaseExpired) {
				continue // elected after the lease ran out; the session lives on
			}
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			delay = min(2*delay, maxRetry)
			continue
		}
		delay = minRetry
		el.set(ld, nil)
		// The leadership's Context ends after its Done closed and its
		// campaign was forgotten, so the next Campaign is not refused as
		// a second one.
		<-ld.Context(ctx).Done()
		if ctx.Err() != nil {
			var resignErr error
			if ld.Err() == nil {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignBound)
				resignErr = ld.Resign(rctx)
				cancel()
			}
			el.stop(stopped(ctx), resignErr)
			return
		}
		el.set(nil, fmt.Errorf("%w: lost the leadership of %q (term %d), campaigning again: %w", ErrNotLeader, name, ld.Term(), ld.Err()))
	}
}

// stopped is why the Elector stopped when its context ended.
func stopped(ctx context.Context) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, ErrElectorClosed) {
		return ErrElectorClosed
	}
	return fmt.Errorf("%w: its context ended: %w", ErrElectorClosed, cause)
}

// set records the leadership won (ld) or why there is none (why), and
// wakes WaitLeader.
func (el *Elector) set(ld *node.Leadership, why error) {
	el.mu.Lock()
	el.ld, el.why = ld, why
	close(el.changed)
	el.changed = make(chan struct{})
	el.mu.Unlock()
}

// stop records that the Elector stopped, and why.
func (el *Elector) stop(err, resignErr error) {
	el.mu.Lock()
	el.ld = nil
	el.why = fmt.Errorf("%w: the elector stopped: %w", ErrNotLeader, err)
	el.err = err
	el.closeErr = resignErr
	close(el.changed)
	el.changed = make(chan struct{})
	el.mu.Unlock()
}
