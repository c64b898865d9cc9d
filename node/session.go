package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// session is this peer's session on one shard: the owner of its locks
// there. Its lease is valid until deadline, a time on the local monotonic
// clock: the send time of the last acknowledged keepalive plus the TTL
// minus the safety margin. The leader expires the session only after a
// full TTL without keepalives, measured from when it received them, which
// is never earlier than when they were sent.
type session struct {
	n     *Node
	shard uint64
	id    uint64

	mu      sync.Mutex
	nextReq uint64
	pending map[uint64]struct{} // acquire and release requests whose final answer is not in yet
	locks   map[uint64]*Lock    // held locks by request id
	// releasing holds a channel per key whose Release has not committed
	// yet; it is closed when the release is in.
	releasing map[string]chan struct{}
	deadline  time.Time
	timer     *time.Timer
	lost      chan struct{}
	lostErr   error
}

// sessionSlot lets concurrent callers share one session open.
type sessionSlot struct {
	done chan struct{}
	s    *session
	err  error
}

// session returns the live session on shard, opening one if needed.
func (n *Node) session(ctx context.Context, shard uint64) (*session, error) {
	for {
		n.sessMu.Lock()
		slot, ok := n.sessions[shard]
		if !ok {
			slot = &sessionSlot{done: make(chan struct{})}
			n.sessions[shard] = slot
			n.sessMu.Unlock()
			slot.s, slot.err = n.openSession(ctx, shard)
			if slot.err != nil {
				n.sessMu.Lock()
				delete(n.sessions, shard)
				n.sessMu.Unlock()
			}
			close(slot.done)
			return slot.s, slot.err
		}
		n.sessMu.Unlock()
		select {
		case <-slot.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if slot.err != nil {
			continue // the opener's context ended; try with ours
		}
		if !slot.s.isLost() {
			return slot.s, nil
		}
		n.dropSession(slot.s)
	}
}

func (n *Node) openSession(ctx context.Context, shard uint64) (*session, error) {
	sent := n.now()
	res, err := n.apply(ctx, shard, lockfsm.Command{
		Op: lockfsm.OpOpenSession, Owner: n.cfg.Name, TTLMillis: uint64(n.cfg.SessionTTL / time.Millisecond),
	})
	if err != nil {
		return nil, fmt.Errorf("open session on shard %d: %w", shard, err)
	}
	if res.Status != lockfsm.StatusOK {
		return nil, fmt.Errorf("open session on shard %d: %s", shard, describe(res))
	}
	s := &session{
		n: n, shard: shard, id: res.Session, nextReq: 1,
		pending: map[uint64]struct{}{}, locks: map[uint64]*Lock{}, releasing: map[string]chan struct{}{},
		lost: make(chan struct{}),
	}
	s.mu.Lock()
	s.extendLocked(sent)
	s.mu.Unlock()
	n.log.Debug("session opened", "shard", shard, "session", s.id)
	return s, nil
}

// dropSession forgets s if it is still the shard's current session.
func (n *Node) dropSession(s *session) {
	n.sessMu.Lock()
	defer n.sessMu.Unlock()
	if slot, ok := n.sessions[s.shard]; ok && slot.s == s {
		delete(n.sessions, s.shard)
	}
}

// liveSessions lists the sessions to keep alive.
func (n *Node) liveSessions() []*session {
	n.sessMu.Lock()
	defer n.sessMu.Unlock()
	var out []*session
	for _, slot := range n.sessions {
		select {
		case <-slot.done:
			if slot.s != nil && !slot.s.isLost() {
				out = append(out, slot.s)
			}
		default:
		}
	}
	return out
}

// newRequest allocates a request id for an acquire attempt.
func (s *session) newRequest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.nextReq
	s.nextReq++
	s.pending[r] = struct{}{}
	return r
}

// finish records that the final answer to request r is in.
func (s *session) finish(r uint64) {
	s.mu.Lock()
	delete(s.pending, r)
	s.mu.Unlock()
}

// releaseCommand is the release of the attempt target. It carries a
// request id of its own, pending until done is called, so the state machine
// keeps the released attempt until this side has the answer: a release
// retried after its first try committed (the answer was lost) is answered
// OK again instead of "not held".
func (s *session) releaseCommand(target uint64) (cmd lockfsm.Command, done func()) {
	req := s.newRequest()
	cmd = lockfsm.Command{Op: lockfsm.OpRelease, Session: s.id, Req: req, Target: target, Ack: s.ack()}
	return cmd, func() { s.finish(req) }
}

// release commits the release of the attempt target, retrying idempotently
// until ctx ends; Unlock waits for it, Release runs it in the background.
func (s *session) release(ctx context.Context, target uint64) (lockfsm.Result, error) {
	cmd, done := s.releaseCommand(target)
	defer done()
	return s.n.apply(ctx, s.shard, cmd)
}

// startRelease takes a released lock out of the session's held locks and
// records its key as being released until endRelease.
func (s *session) startRelease(l *Lock) chan struct{} {
	done := make(chan struct{})
	s.mu.Lock()
	delete(s.locks, l.req)
	s.releasing[l.key] = done
	s.mu.Unlock()
	return done
}

func (s *session) endRelease(key string, done chan struct{}) {
	s.mu.Lock()
	if s.releasing[key] == done {
		delete(s.releasing, key)
	}
	s.mu.Unlock()
	close(done)
}

// awaitRelease waits until no release of key by this session is in flight.
func (s *session) awaitRelease(ctx context.Context, key string) error {
	s.mu.Lock()
	done, ok := s.releasing[key]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-s.lost:
		return nil // the caller starts over in a new session
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ack is the lowest request id whose answer is still outstanding: the
// state machine may forget finished attempts below it.
func (s *session) ack() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.nextReq
	for r := range s.pending {
		a = min(a, r)
	}
	return a
}

// extend moves the lease deadline after a keepalive sent at sent was
// acknowledged. A lease whose deadline has already passed is never
// revived, even if its timer has not run yet: the holder may have been
// told its lock is lost, and the leader may be expiring the session. It
// is lost now instead.
func (s *session) extend(sent time.Time) {
	s.mu.Lock()
	if s.lostErr != nil {
		s.mu.Unlock()
		return
	}
	if s.n.now().Before(s.deadline) {
		s.extendLocked(sent)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.checkDeadline()
}

func (s *session) extendLocked(sent time.Time) {
	d := sent.Add(s.n.cfg.SessionTTL - s.n.cfg.LeaseMargin)
	if d.Before(s.deadline) {
		return
	}
	s.deadline = d
	wait := d.Sub(s.n.now())
	if s.timer == nil {
		s.timer = time.AfterFunc(wait, s.onTimer)
	} else {
		s.timer.Reset(wait)
	}
}

// onTimer fires at the deadline as the clock stood when it was set; if the
// lease was extended meanwhile, or the clock says otherwise, it re-arms.
func (s *session) onTimer() {
	s.checkDeadline()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lostErr == nil {
		s.timer.Reset(max(s.deadline.Sub(s.n.now()), time.Millisecond))
	}
}

// checkDeadline loses the session if its deadline has passed; it runs from
// the deadline timer and from every Lock.Done and Lock.Err call.
func (s *session) checkDeadline() {
	s.mu.Lock()
	if s.lostErr != nil {
		s.mu.Unlock()
		return
	}
	left := s.deadline.Sub(s.n.now())
	if left > 0 {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.lose(fmt.Errorf("%w: keepalives on shard %d not acknowledged within the session TTL of %v", ErrLeaseExpired, s.shard, s.n.cfg.SessionTTL))
}

func (s *session) isLost() bool {
	select {
	case <-s.lost:
		return true
	default:
		return false
	}
}

// lose ends the session on this side: every lock it holds reports err on
// Done, and the session is closed on the cluster in the background so its
// locks are handed on without waiting for the TTL.
func (s *session) lose(err error) {
	s.mu.Lock()
	if s.lostErr != nil {
		s.mu.Unlock()
		return
	}
	s.lostErr = err
	close(s.lost)
	if s.timer != nil {
		s.timer.Stop()
	}
	locks := s.locks
	s.locks = map[uint64]*Lock{}
	s.mu.Unlock()
	for _, l := range locks {
		l.lose(err)
	}
	s.n.dropSession(s)
	s.n.log.Warn("session lost", "shard", s.shard, "session", s.id, "locks", len(locks), "err", err)
	if !s.n.isClosed() && !errors.Is(err, ErrClosed) {
		s.n.goFunc(func() { s.closeOnCluster(s.n.ctx) })
	}
}

// closeOnCluster closes the session on the cluster so its locks are handed
// on without waiting for the leader to expire it. A close that cannot
// commit (the shard has no quorum) is tried again, a TTL at a time, until
// it lands or the node closes: when the quorum returns, the keys are freed
// at the next try instead of a full TTL after the new leader's grace.
func (s *session) closeOnCluster(ctx context.Context) {
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, s.n.cfg.SessionTTL)
		_, err := s.n.apply(tctx, s.shard, lockfsm.Command{Op: lockfsm.OpCloseSession, Session: s.id})
		cancel()
		if err == nil || ctx.Err() != nil || s.n.isClosed() {
			return
		}
		if !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			s.n.log.Warn("session close failed", "shard", s.shard, "session", s.id, "err", err)
			return
		}
		s.n.log.Info("session close not committed yet; trying again", "shard", s.shard, "session", s.id, "try", try, "err", err)
	}
}

// closeSessions closes every session on the cluster, handing their locks to
// waiters at once. Used by Close; bounded by a few RTTs per shard.
func (n *Node) closeSessions() {
	sessions := n.liveSessions()
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Locally first: the holders here must see Done closed before
			// the cluster hands their locks to someone else.
			s.lose(fmt.Errorf("%w: session %d on shard %d ended with it; its locks pass to the next waiters", ErrClosed, s.id, s.shard))
			ctx, cancel := context.WithTimeout(n.ctx, 20*n.cfg.RTT)
			defer cancel()
			_, _ = n.apply(ctx, s.shard, lockfsm.Command{Op: lockfsm.OpCloseSession, Session: s.id})
		}()
	}
	wg.Wait()
}

// describe names an unexpected result for an error text or a log line,
// by status name ("Invalid"), not number.
func describe(r lockfsm.Result) string {
	if r.Err != "" {
		return fmt.Sprintf("status %v: %s", r.Status, r.Err)
	}
	return fmt.Sprintf("status %v", r.Status)
}
