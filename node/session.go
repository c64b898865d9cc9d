package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Session is a lease on the cluster that the locks taken through it belong
// to, as in etcd's concurrency.Session. It holds one replicated session on
// each shard it has taken a lock on, all kept alive by this node's one
// keepalive loop and all ending together: when any of them is lost (its
// keepalives went unacknowledged for the TTL, or the cluster expired it),
// the whole Session is, Done closes, every lock taken through it reports
// the loss on its own Done, and the rest are closed on the cluster so
// their keys pass on at once.
//
// Node.Lock and Node.TryLock use the node's default sessions instead: one
// per shard with Config.SessionTTL, each replaced by a new one when lost,
// so a loss on one shard does not end locks on another.
//
// A Session is safe for concurrent use.
type Session struct {
	n   *Node
	ttl time.Duration

	mu       sync.Mutex
	shards   map[uint64]*sessionSlot // the replicated session on each shard used
	orphaned bool                    // keepalives stopped by Orphan
	done     chan struct{}
	err      error // why done closed
}

// SessionOption configures NewSession.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl time.Duration
}

// WithTTL sets the session's time to live: how long the cluster keeps its
// locks after its keepalives stop (a crash, a partition). It must be at
// least 40 RTT and more than twice Config.LeaseMargin. The default is
// Config.SessionTTL. A holder gives its lease up Config.LeaseMargin, or a
// tenth of the TTL if that is longer, before the TTL runs out.
func WithTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = d }
}

// NewSession starts a session. It does no I/O: the session opens on each
// shard at its first lock there. It fails with ErrInvalidConfig for a TTL
// out of range and ErrClosed after Close; ctx is for future options that
// do I/O.
func (n *Node) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	o := sessionOptions{ttl: n.cfg.SessionTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if min := max(40*n.cfg.RTT, 2*n.cfg.LeaseMargin+time.Millisecond); o.ttl < min {
		return nil, fmt.Errorf("%w: session TTL %v is below %v (40 RTT, and more than twice LeaseMargin)", ErrInvalidConfig, o.ttl, min)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return n.newSession(o.ttl)
}

func (n *Node) newSession(ttl time.Duration) (*Session, error) {
	n.sessMu.Lock()
	defer n.sessMu.Unlock()
	return n.newSessionLocked(ttl)
}

// newSessionLocked is newSession with n.sessMu held.
func (n *Node) newSessionLocked(ttl time.Duration) (*Session, error) {
	if n.sessionsClosed || n.isClosed() {
		return nil, ErrClosed
	}
	s := &Session{n: n, ttl: ttl, shards: map[uint64]*sessionSlot{}, done: make(chan struct{})}
	n.sessions[s] = struct{}{}
	return s, nil
}

// TTL returns the session's time to live.
func (s *Session) TTL() time.Duration { return s.ttl }

// margin is how much earlier than its TTL after the last acknowledged
// keepalive the holder gives its lease up: Config.LeaseMargin, and at
// least a tenth of the TTL, so that a long TTL keeps the same tolerance of
// clock-rate differences (docs/SAFETY.md) as the default one.
func (s *Session) margin() time.Duration { return max(s.n.cfg.LeaseMargin, s.ttl/10) }

// Done is closed when the session ends: lost (ErrLeaseExpired), closed
// (ErrSessionClosed) or ended with its node (ErrClosed). Err says which.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns nil while the session lives, then why Done closed.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Lock takes key for this session; see Node.Lock. It fails with an error
// wrapping ErrLeaseExpired or ErrSessionClosed once the session has ended.
func (s *Session) Lock(ctx context.Context, key string) (*Lock, error) {
	return s.acquire(ctx, key, true)
}

// TryLock takes key for this session if it is free; see Node.TryLock.
func (s *Session) TryLock(ctx context.Context, key string) (*Lock, error) {
	return s.acquire(ctx, key, false)
}

func (s *Session) acquire(ctx context.Context, key string, wait bool) (*Lock, error) {
	l, retry, err := s.n.acquireIn(ctx, key, wait, func(uint64) *Session { return s })
	if retry {
		if err = s.Err(); err == nil {
			err = fmt.Errorf("%w: session lost", ErrLeaseExpired)
		}
		return nil, fmt.Errorf("lock %q: %w", key, err)
	}
	return l, err
}

// Close ends the session now: its locks' Done close (ErrSessionClosed),
// then the session is closed on every shard it used, which releases its
// locks and hands them to their next waiters in the same Raft entry.
// Close waits for those closes until ctx ends; a close that has not
// committed by then goes on in the background, and Close returns an error
// saying so (the cluster frees the keys when the TTL runs out at the
// latest). Close is idempotent.
func (s *Session) Close(ctx context.Context) error {
	ss := s.end(fmt.Errorf("%w: closed", ErrSessionClosed))
	if s.isOrphaned() {
		return nil
	}
	errs := make(chan error, len(ss))
	for _, sh := range ss {
		s.n.goFunc(func() { errs <- sh.closeOnCluster(s.n.ctx) })
	}
	var failed []error
	for range ss {
		select {
		case err := <-errs:
			if err != nil {
				failed = append(failed, err)
			}
		case <-ctx.Done():
			return fmt.Errorf("close session: not every shard has committed the close; it goes on in the background: %w", ctx.Err())
		}
	}
	return errors.Join(failed...)
}

// Orphan stops the session's keepalives without closing it: the cluster
// frees its locks when its TTL runs out, and their Done (and the
// session's) close when the lease can no longer be relied on, as after a
// crash. Use it to hand the locks' fate to the TTL, for example when this
// process is about to exit and another will take over.
func (s *Session) Orphan() {
	s.mu.Lock()
	s.orphaned = true
	s.mu.Unlock()
}

func (s *Session) isOrphaned() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.orphaned
}

// sessionSlot lets concurrent callers share one session open.
type sessionSlot struct {
	done chan struct{}
	s    *session
	err  error
}

// shardSession returns the session's replicated session on shard,
// opening one if needed, or the Session's error once it has ended.
func (s *Session) shardSession(ctx context.Context, shard uint64) (*session, error) {
	for {
		s.mu.Lock()
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return nil, err
		}
		slot, ok := s.shards[shard]
		if !ok {
			slot = &sessionSlot{done: make(chan struct{})}
			s.shards[shard] = slot
			s.mu.Unlock()
			slot.s, slot.err = s.n.openSession(ctx, s, shard)
			// Published under s.mu: either end already ran (and did not
			// see this slot), so the new session is ended here, or end
			// runs later and ends it with the others.
			s.mu.Lock()
			if slot.err != nil {
				delete(s.shards, shard)
			}
			close(slot.done)
			ended := s.err
			s.mu.Unlock()
			if ended != nil && slot.s != nil {
				slot.s.loseLocally(ended)
				s.closeInBackground(ended, []*session{slot.s})
				return nil, ended
			}
			return slot.s, slot.err
		}
		s.mu.Unlock()
		select {
		case <-slot.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if slot.err != nil {
			continue // the opener's context ended; try with ours
		}
		return slot.s, nil
	}
}

// openedLocked returns the replicated sessions whose open has finished.
// s.mu must be held.
func (s *Session) openedLocked() []*session {
	var out []*session
	for _, slot := range s.shards {
		select {
		case <-slot.done:
			if slot.s != nil {
				out = append(out, slot.s)
			}
		default:
		}
	}
	return out
}

// end ends the session on this side with err, once, and returns its
// replicated sessions, each lost with err.
func (s *Session) end(err error) []*session {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil
	}
	s.err = err
	close(s.done)
	ss := s.openedLocked()
	s.mu.Unlock()
	s.n.sessMu.Lock()
	delete(s.n.sessions, s)
	for shard, d := range s.n.defaults {
		if d == s {
			delete(s.n.defaults, shard)
		}
	}
	s.n.sessMu.Unlock()
	for _, sh := range ss {
		sh.loseLocally(err)
	}
	return ss
}

// lost ends the session because one of its replicated sessions was lost,
// and closes the others on the cluster so their keys pass on at once.
func (s *Session) lost(err error) {
	s.closeInBackground(err, s.end(err))
}

// closeInBackground closes ss, replicated sessions of s that ended with
// err, on the cluster, so their keys pass on at once; not for an orphaned
// session (its TTL decides) or when the node closes (Close does it).
func (s *Session) closeInBackground(err error, ss []*session) {
	if s.n.isClosed() || errors.Is(err, ErrClosed) || s.isOrphaned() {
		return
	}
	for _, sh := range ss {
		s.n.goFunc(func() { _ = sh.closeOnCluster(s.n.ctx) })
	}
}

// defaultSession returns the node's live default session for shard,
// starting a new one if there is none or the last was lost.
func (n *Node) defaultSession(shard uint64) (*Session, error) {
	n.sessMu.Lock()
	defer n.sessMu.Unlock()
	if s := n.defaults[shard]; s != nil && s.Err() == nil {
		return s, nil
	}
	s, err := n.newSessionLocked(n.cfg.SessionTTL)
	if err == nil {
		n.defaults[shard] = s
	}
	return s, err
}

// session is one replicated session, on one shard, of a Session: the
// owner of its locks there. Its lease is valid until deadline, a time on
// the local monotonic clock: the send time of the last acknowledged
// keepalive plus the TTL minus the safety margin. The leader expires the
// session only after a full TTL without keepalives, measured from when it
// received them, which is never earlier than when they were sent.
type session struct {
	n     *Node
	owner *Session
	shard uint64
	id    uint64

	// attempts are its request ids, the ones without their final answer
	// yet, and the keys being released.
	attempts *client.Attempts

	mu       sync.Mutex
	locks    map[uint64]*Lock // held locks by request id
	deadline time.Time
	timer    *time.Timer
	lost     chan struct{}
	lostErr  error
}

func (n *Node) openSession(ctx context.Context, owner *Session, shard uint64) (*session, error) {
	sent := n.now()
	res, err := n.apply(ctx, shard, lockfsm.Command{
		Op: lockfsm.OpOpenSession, Owner: n.cfg.Name, TTLMillis: uint64((owner.ttl + time.Millisecond - 1) / time.Millisecond),
	})
	if err != nil {
		return nil, fmt.Errorf("open session on shard %d: %w", shard, err)
	}
	if res.Status != lockfsm.StatusOK {
		return nil, fmt.Errorf("open session on shard %d: %s", shard, describe(res))
	}
	s := &session{
		n: n, owner: owner, shard: shard, id: res.Session, attempts: client.NewAttempts(),
		locks: map[uint64]*Lock{}, lost: make(chan struct{}),
	}
	s.mu.Lock()
	s.extendLocked(sent)
	s.mu.Unlock()
	n.log.Debug("session opened", "shard", shard, "session", s.id)
	n.kickKeepAlives()
	return s, nil
}

// liveSessions lists the replicated sessions to keep alive: those of every
// live, not orphaned Session.
func (n *Node) liveSessions() []*session {
	n.sessMu.Lock()
	owners := make([]*Session, 0, len(n.sessions))
	for s := range n.sessions {
		owners = append(owners, s)
	}
	n.sessMu.Unlock()
	var out []*session
	for _, o := range owners {
		o.mu.Lock()
		if o.err == nil && !o.orphaned {
			for _, s := range o.openedLocked() {
				if !s.isLost() {
					out = append(out, s)
				}
			}
		}
		o.mu.Unlock()
	}
	return out
}

// releaseCommand is the release of the attempt target. It carries a
// request id of its own, pending until done is called, so the state machine
// keeps the released attempt until this side has the answer: a release
// retried after its first try committed (the answer was lost) is answered
// OK again instead of "not held".
func (s *session) releaseCommand(target uint64) (cmd lockfsm.Command, done func()) {
	req := s.attempts.Begin()
	cmd = lockfsm.Command{Op: lockfsm.OpRelease, Session: s.id, Req: req, Target: target, Ack: s.attempts.Ack()}
	return cmd, func() { s.attempts.Finish(req) }
}

// release commits the release of the attempt target, retrying idempotently
// until ctx ends; Unlock waits for it, Release runs it in the background.
func (s *session) release(ctx context.Context, target uint64) (lockfsm.Result, error) {
	cmd, done := s.releaseCommand(target)
	defer done()
	return s.n.apply(ctx, s.shard, cmd)
}

// startRelease takes a released lock out of the session's held locks and
// records its key as being released until attempts.EndRelease.
func (s *session) startRelease(l *Lock) chan struct{} {
	s.mu.Lock()
	delete(s.locks, l.req)
	s.mu.Unlock()
	return s.attempts.StartRelease(l.key)
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
	d := sent.Add(s.owner.ttl - s.owner.margin())
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
	s.lose(fmt.Errorf("%w: keepalives on shard %d not acknowledged within the session TTL of %v", ErrLeaseExpired, s.shard, s.owner.ttl))
}

func (s *session) isLost() bool {
	select {
	case <-s.lost:
		return true
	default:
		return false
	}
}

// lose ends the session on this side because it was lost, which ends its
// whole Session: every lock it holds reports err on Done, and the
// session (with the Session's others) is closed on the cluster in the
// background so its locks are handed on without waiting for the TTL.
func (s *session) lose(err error) {
	if s.loseLocally(err) {
		s.owner.lost(err) // closes this one on the cluster with the others
	}
}

// loseLocally ends the session on this side, once: its locks' Done close
// with err. It reports whether this call ended it.
func (s *session) loseLocally(err error) bool {
	s.mu.Lock()
	if s.lostErr != nil {
		s.mu.Unlock()
		return false
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
	level := s.n.log.Warn
	if errors.Is(err, ErrSessionClosed) || errors.Is(err, ErrClosed) {
		level = s.n.log.Debug
	}
	level("session ended", "shard", s.shard, "session", s.id, "locks", len(locks), "err", err)
	return true
}

// closeOnCluster closes the session on the cluster so its locks are handed
// on without waiting for the leader to expire it. A close that cannot
// commit (the shard has no quorum) is tried again, a TTL at a time, until
// it lands or ctx ends or the node closes: when the quorum returns, the
// keys are freed at the next try instead of a full TTL after the new
// leader's grace. It returns the last error when it gives up.
func (s *session) closeOnCluster(ctx context.Context) error {
	for try := 1; ; try++ {
		tctx, cancel := context.WithTimeout(ctx, s.owner.ttl)
		_, err := s.n.apply(tctx, s.shard, lockfsm.Command{Op: lockfsm.OpCloseSession, Session: s.id})
		cancel()
		if err == nil || ctx.Err() != nil || s.n.isClosed() {
			return err
		}
		if !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			s.n.log.Warn("session close failed", "shard", s.shard, "session", s.id, "err", err)
			return err
		}
		s.n.log.Info("session close not committed yet; trying again", "shard", s.shard, "session", s.id, "try", try, "err", err)
	}
}

// closeSessions ends every session of this node, handing their locks to
// waiters at once; orphaned ones are left to their TTL. Used by Close;
// bounded by a few RTTs per shard.
func (n *Node) closeSessions() {
	n.sessMu.Lock()
	n.sessionsClosed = true // no new Session from here on
	owners := make([]*Session, 0, len(n.sessions))
	for s := range n.sessions {
		owners = append(owners, s)
	}
	n.sessMu.Unlock()
	var wg sync.WaitGroup
	for _, o := range owners {
		orphaned := o.isOrphaned()
		// Locally first: the holders here must see Done closed before
		// the cluster hands their locks to someone else.
		for _, s := range o.end(fmt.Errorf("%w: the session ended with it; its locks pass to the next waiters", ErrClosed)) {
			if orphaned {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(n.ctx, 20*n.cfg.RTT)
				defer cancel()
				_, _ = n.apply(ctx, s.shard, lockfsm.Command{Op: lockfsm.OpCloseSession, Session: s.id})
			}()
		}
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
