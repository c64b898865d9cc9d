package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Held is the client side of a held lock (node.Lock): the attempt that
// was granted, its fencing token, and whether this holder may still rely
// on it. Safe for concurrent use.
type Held struct {
	s     *Session
	key   string
	req   uint64
	token uint64

	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// newHeld records the grant of attempt req on key; if the session was
// lost meanwhile, the lock comes back already ended with its error.
func (s *Session) newHeld(key string, req, token uint64) *Held {
	h := &Held{s: s, key: key, req: req, token: token, done: make(chan struct{})}
	s.mu.Lock()
	err := s.lostErr
	if err == nil {
		s.held[req] = h
	}
	s.mu.Unlock()
	if err != nil {
		h.claim(err)
	}
	return h
}

// holds reports whether s holds key now.
func (s *Session) holds(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.held {
		if h.key == key {
			return true
		}
	}
	return false
}

// Key returns the locked key.
func (h *Held) Key() string { return h.key }

// Token returns the grant's fencing token.
func (h *Held) Token() uint64 { return h.token }

// Req returns the request id of the granted attempt.
func (h *Held) Req() uint64 { return h.req }

// Session returns the replicated session that holds the lock.
func (h *Held) Session() *Session { return h.s }

// Done is closed when the holder can no longer rely on the lock. It
// compares the lease deadline with the clock on every call, so that a
// holder paused past its deadline is never told its lease is valid
// because the deadline timer has not run yet.
func (h *Held) Done() <-chan struct{} {
	h.checkLease()
	return h.done
}

// Err returns nil while the lock is held, then why Done closed. Like
// Done, it checks the lease deadline against the clock.
func (h *Held) Err() error {
	h.checkLease()
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// checkLease loses the lock at once if its session's deadline has passed.
func (h *Held) checkLease() {
	select {
	case <-h.done:
		return
	default:
	}
	h.s.CheckDeadline()
}

// claim closes Done with err and reports whether this call did it, so
// that of two racing ends of a lock exactly one acts on it.
func (h *Held) claim(err error) (won bool) {
	h.once.Do(func() {
		won = true
		h.mu.Lock()
		h.err = err
		h.mu.Unlock()
		close(h.done)
	})
	return won
}

// heldErr is the error Unlock and Release return for a lock that is no
// longer held: already unlocked, or its lease was lost.
func (h *Held) heldErr(err error) error {
	if errors.Is(err, lockerr.NotHeld) {
		return fmt.Errorf("unlock %q: already unlocked: %w", h.key, lockerr.NotHeld)
	}
	return fmt.Errorf("unlock %q: %w", h.key, err)
}

// Unlock ends the lock for its holder (Done closes, Err returns
// lockerr.NotHeld) before it proposes the release, then waits until the
// release has committed or ctx ends. A release still uncommitted when ctx
// ends goes on in the background, as with Release, and Unlock returns an
// error wrapping ctx's error that says so. A nil error means the release
// committed. A lock lost before the call gives an error wrapping
// lockerr.LeaseExpired; one already given up, lockerr.NotHeld.
func (h *Held) Unlock(ctx context.Context) error {
	if err := h.end(); err != nil {
		return err
	}
	select {
	case o := <-h.releaseInBackground():
		if o.err != nil {
			return fmt.Errorf("unlock %q: %w", h.key, o.err)
		}
		switch o.res.Status {
		case lockfsm.StatusOK:
			return nil
		case lockfsm.StatusNoSession:
			return fmt.Errorf("unlock %q: %w: the session ended before the release reached the cluster", h.key, lockerr.LeaseExpired)
		case lockfsm.StatusNotHeld:
			return fmt.Errorf("unlock %q: %w", h.key, lockerr.NotHeld)
		default:
			return fmt.Errorf("unlock %q: %s", h.key, Describe(o.res))
		}
	case <-ctx.Done():
		return fmt.Errorf("unlock %q: the release is not known to have committed; it goes on in the background: %w", h.key, ctx.Err())
	}
}

// Release ends the lock for its holder at once and commits the release in
// the background; an acquire of the key from this peer waits for it. It
// returns the same errors as Unlock for a lock already given up or lost.
func (h *Held) Release() error {
	if err := h.end(); err != nil {
		return err
	}
	h.releaseInBackground()
	return nil
}

// end closes Done because the caller gives the lock up, or returns the
// error for a lock that was already given up or lost.
func (h *Held) end() error {
	if err := h.Err(); err != nil {
		return h.heldErr(err)
	}
	if !h.claim(fmt.Errorf("%w: released", lockerr.NotHeld)) {
		return h.heldErr(h.Err())
	}
	return nil
}

// outcome is a release's answer.
type outcome struct {
	res lockfsm.Result
	err error
}

// releaseInBackground commits the release of h, bounded by the session
// TTL, and sends its outcome on the returned channel (buffered: nobody
// needs to read it). An acquire of the same key on this peer waits for it.
// A release that does not commit loses the session: its keepalives would
// otherwise keep the key held for as long as this peer lives.
func (h *Held) releaseInBackground() <-chan outcome {
	s := h.s
	out := make(chan outcome, 1)
	s.mu.Lock()
	delete(s.held, h.req)
	s.mu.Unlock()
	done := s.attempts.StartRelease(h.key)
	s.c.cfg.Go(func(bg context.Context) {
		defer s.attempts.EndRelease(h.key, done)
		ctx, cancel := context.WithTimeout(bg, s.owner.ttl)
		defer cancel()
		res, err := s.release(ctx, h.req)
		out <- outcome{res: res, err: err}
		if err != nil && !s.c.stopped() {
			s.Lose(fmt.Errorf("%w: release of %q on shard %d did not commit: %v", lockerr.LeaseExpired, h.key, s.shard, err))
			return
		}
		if err == nil && res.Status != lockfsm.StatusOK {
			s.c.cfg.Log.Debug("release not applied", "key", h.key, "shard", s.shard, "result", Describe(res))
		}
	})
	return out
}

// ReleaseCommand is the release of the attempt target. It carries a
// request id of its own, pending until done is called, so the state machine
// keeps the released attempt until this side has the answer: a release
// retried after its first try committed (the answer was lost) is answered
// OK again instead of "not held".
func (s *Session) ReleaseCommand(target uint64) (cmd lockfsm.Command, done func()) {
	req := s.attempts.Begin()
	cmd = lockfsm.Command{Op: lockfsm.OpRelease, Session: s.id, Req: req, Target: target, Ack: s.attempts.Ack()}
	return cmd, func() { s.attempts.Finish(req) }
}

// release commits the release of the attempt target, retrying idempotently
// until ctx ends.
func (s *Session) release(ctx context.Context, target uint64) (lockfsm.Result, error) {
	cmd, done := s.ReleaseCommand(target)
	defer done()
	return s.c.cfg.Apply(ctx, s.shard, cmd)
}

// Acquire takes key, which lives in shard, for the Owner: in its
// replicated session there (opened if needed), after this peer's own
// release of key, if one is in flight, has committed. With wait it queues
// behind the key's holder and waiters (FIFO) until granted or ctx ends;
// without, a held or awaited key fails at once with lockerr.Locked. A key
// the Owner holds already fails at once with lockerr.AlreadyHeld, unless
// the Owner is a shared default one (its other holder is another caller).
//
// retry is true, with a nil lock and error, when the Owner's session was
// lost on the way: the caller starts over in a live Owner, or reports the
// Owner's error. When ctx ends first, the attempt leaves the queue (a
// grant that raced it is released) and ctx's error is returned.
func (o *Owner) Acquire(ctx context.Context, shard uint64, key string, wait bool) (h *Held, retry bool, err error) {
	s, err := o.Session(ctx, shard)
	if err != nil {
		if o.Err() != nil {
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("lock %q: %w", key, err)
	}
	if !o.shared && s.holds(key) {
		// It would queue behind itself until ctx ends.
		return nil, false, fmt.Errorf("lock %q: %w: locks are not reentrant; unlock it first, or lock through another Session", key, lockerr.AlreadyHeld)
	}
	if err := s.attempts.AwaitRelease(ctx, key, s.lost); err != nil {
		return nil, false, fmt.Errorf("lock %q: wait for this node's release: %w", key, err)
	}
	if s.isLost() {
		return nil, true, nil
	}
	return s.attempt(ctx, key, wait)
}

// attempt makes one acquire attempt in s. retry is true when the session
// was lost on the way.
func (s *Session) attempt(ctx context.Context, key string, wait bool) (h *Held, retry bool, err error) {
	c := s.c
	req := s.attempts.Begin()
	abandoned := false // an abandoned attempt stays pending until its cancel is in
	defer func() {
		if !abandoned {
			s.attempts.Finish(req)
		}
	}()
	waiter := WaiterKey{Shard: s.shard, Session: s.id, Req: req}
	granted := c.waiters.Add(waiter)
	defer c.waiters.Remove(waiter)

	res, err := c.cfg.Apply(ctx, s.shard, lockfsm.Command{
		Op: lockfsm.OpAcquire, Session: s.id, Req: req, Ack: s.attempts.Ack(), Key: key, Wait: wait, Limit: 1,
	})
	if err != nil {
		abandoned = s.abandon(req)
		return nil, false, fmt.Errorf("lock %q: %w", key, err)
	}
	switch res.Status {
	case lockfsm.StatusGranted:
		return s.newHeld(key, req, res.Token), false, nil
	case lockfsm.StatusLocked:
		return nil, false, fmt.Errorf("lock %q: %w", key, lockerr.Locked)
	case lockfsm.StatusNoSession:
		s.Lose(fmt.Errorf("%w: shard %d no longer knows session %d", lockerr.LeaseExpired, s.shard, s.id))
		return nil, true, nil
	case lockfsm.StatusQueued:
	default:
		return nil, false, fmt.Errorf("lock %q: %s", key, Describe(res))
	}

	// Queued: wait for the grant. A token comes from this peer's own
	// replica; a notice, or the slow re-read that covers lost notices, is
	// checked against the replicated state. The re-read is liveness, not
	// lease timing, so it runs on Go's timers.
	poll := time.NewTicker(s.owner.ttl / 4)
	defer poll.Stop()
	for {
		select {
		case tok := <-granted:
			if tok != Verify {
				return s.newHeld(key, req, tok), false, nil
			}
		case <-poll.C:
		case <-s.lost:
			return nil, true, nil
		case <-ctx.Done():
			abandoned = s.abandon(req)
			return nil, false, fmt.Errorf("lock %q: %w", key, ctx.Err())
		case <-c.cfg.Stop:
			return nil, false, lockerr.Closed
		}
		found, a, err := c.cfg.ReadAttempt(ctx, s.shard, s.id, req)
		if err != nil {
			continue
		}
		if !found {
			s.Lose(fmt.Errorf("%w: shard %d no longer knows session %d", lockerr.LeaseExpired, s.shard, s.id))
			return nil, true, nil
		}
		if a.State == lockfsm.ReqHeld {
			return s.newHeld(key, req, a.Token), false, nil
		}
	}
}

// abandon withdraws an acquire attempt whose caller gave up. Cancel
// dequeues it, or releases it if it was granted meanwhile, so an abandoned
// grant never leaks. It runs in the background, bounded by the session TTL,
// and reports whether it took over finishing req.
//
// A cancel that does not commit in time loses the whole session, as a
// release that does not commit does: the session's keepalives would
// otherwise keep the abandoned request queued, or granted to nobody, for
// as long as this peer lives, and the key with it (seen under delay-drop).
// Losing the session closes it on the cluster, which ends the request.
func (s *Session) abandon(req uint64) bool {
	if s.c.stopped() {
		return false
	}
	s.c.cfg.Go(func(bg context.Context) {
		defer s.attempts.Finish(req)
		ctx, cancel := context.WithTimeout(bg, s.owner.ttl)
		defer cancel()
		_, err := s.c.cfg.Apply(ctx, s.shard, lockfsm.Command{Op: lockfsm.OpCancel, Session: s.id, Target: req})
		if err != nil && !s.c.stopped() {
			s.Lose(fmt.Errorf("%w: withdrawal of an abandoned lock attempt on shard %d did not commit: %v", lockerr.LeaseExpired, s.shard, err))
		}
	})
	return true
}
