package client

import (
	sess "context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"

	"github.com/lockmesh/lockmesh/internal/clock"
)

// Session is the client side of a node.Session: the owner of one replicated
// session on each shard it has taken a lock on, all kept alive by the
// Client's keepalive loop and all ending together. When any of them is
// lost, the whole Session ends, every lock taken through it reports the
// loss, and the others are closed on the cluster so their keys pass on at
// once. Safe for concurrent use.
type Session struct {
	c   *Client
	ttl time.Duration
	// label names the Session on every shard: each of its replicated
	// sessions has an id of its shard's own, and all carry this label.
	label uint64
	// shared is set for the default Sessions node.Lock uses: every goroutine
	// of the node locks through them, so a second Lock of a held key is
	// another goroutine queueing behind the first, not a self-wait.
	shared bool
	// reentrant lets the Session take a key it holds again (same kind): it
	// gets the same grant with one more hold (node.WithReentrant).
	reentrant bool

	mu       sync.Mutex
	shards   map[uint64]*slot // the replicated session on each shard used
	orphaned bool             // keepalives stopped by Orphan
	done     chan struct{}
	err      error // why done closed
}

// slot lets concurrent callers share one session open.
type slot struct {
	done chan struct{}
	s    *ShardSession
	err  error
}

// SetReentrant makes the Session reentrant; call it before its first lock.
func (s *Session) SetReentrant() { s.reentrant = true }

// Shared reports whether the Session is a shared default one (node.Lock's).
func (s *Session) Shared() bool { return s.shared }

// Label returns the Session's label: random, never 0, and given to every
// replicated session it opens once the cluster's level allows it.
func (s *Session) Label() uint64 { return s.label }

// TTL returns the Session's time to live.
func (s *Session) TTL() time.Duration { return s.ttl }

// Done is closed when the Session ends; Err says why.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err returns nil while the Session lives, then why Done closed: lost
// (lockerr.LeaseExpired), closed (lockerr.SessionClosed) or ended with its
// node (lockerr.Closed).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Orphan stops the Session's keepalives without closing it: the cluster
// frees its locks when its TTL runs out, and its locks' Done close when
// their leases run out, as after a crash.
func (s *Session) Orphan() {
	s.mu.Lock()
	s.orphaned = true
	s.mu.Unlock()
}

// Orphaned reports whether Orphan was called.
func (s *Session) Orphaned() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.orphaned
}

// OnShard returns the Session's replicated session on shard, opening one if
// needed (concurrent callers share one open), or the Session's error once it
// has ended. A session opened while the Session ended is ended at once.
func (s *Session) OnShard(ctx sess.Context, shard uint64) (*ShardSession, error) {
	for {
		s.mu.Lock()
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return nil, err
		}
		sl, ok := s.shards[shard]
		if !ok {
			sl = &slot{done: make(chan struct{})}
			s.shards[shard] = sl
			s.mu.Unlock()
			sl.s, sl.err = s.c.open(ctx, s, shard)
			// Published under o.mu: either end already ran (and did not
			// see this slot), so the new session is ended here, or end
			// runs later and ends it with the others.
			s.mu.Lock()
			if sl.err != nil {
				delete(s.shards, shard)
			}
			close(sl.done)
			ended := s.err
			s.mu.Unlock()
			if sl.err == nil {
				// Now that live lists it: a kick sent before would let
				// the loop size its next round without this session's
				// TTL, and a TTL shorter than the round could run out.
				s.c.kickKeepAlives()
			}
			if ended != nil && sl.s != nil {
				sl.s.loseLocally(ended)
				s.closeInBackground(ended, []*ShardSession{sl.s})
				return nil, ended
			}
			return sl.s, sl.err
		}
		s.mu.Unlock()
		select {
		case <-sl.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if sl.err != nil {
			continue // the opener's context ended; try with ours
		}
		return sl.s, nil
	}
}

// Holds reports whether the Session holds key, which lives in shard, as a
// hold that is not ending (see Session.liveHold). It opens nothing: on a
// shard where the Session has no session yet, it holds nothing.
func (s *Session) Holds(shard uint64, key string) bool {
	s.mu.Lock()
	sl := s.shards[shard]
	s.mu.Unlock()
	if sl == nil {
		return false
	}
	select {
	case <-sl.done:
	default:
		return false // still opening: nothing is held through it yet
	}
	if sl.s == nil {
		return false
	}
	_, live := sl.s.listedHold(key)
	return live != nil
}

// openedLocked returns the replicated sessions whose open has finished.
// o.mu must be held.
func (s *Session) openedLocked() []*ShardSession {
	var out []*ShardSession
	for _, sl := range s.shards {
		select {
		case <-sl.done:
			if sl.s != nil {
				out = append(out, sl.s)
			}
		default:
		}
	}
	return out
}

// Close ends the Session now: its locks' Done close (lockerr.SessionClosed),
// then it is closed on every shard it used, which releases its locks and
// hands them to their next waiters in the same Raft entry. It waits for
// those closes until ctx ends; a close that has not committed by then goes
// on in the background, and Close returns an error saying so. Close after
// Orphan releases what the Session still holds, as any Close does: Orphan
// only stopped its keepalives. Idempotent.
func (s *Session) Close(ctx sess.Context) error {
	ss := s.end(lockerr.SessionClosed)
	errs := make(chan error, len(ss))
	for _, sh := range ss {
		s.c.cfg.Go(func(bg sess.Context) { errs <- sh.closeOnCluster(bg) })
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

// end ends the Session on this side with err, once, and returns its
// replicated sessions, each lost with err.
func (s *Session) end(err error) []*ShardSession {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil
	}
	s.err = err
	close(s.done)
	ss := s.openedLocked()
	s.mu.Unlock()
	s.c.forget(s)
	for _, s := range ss {
		s.loseLocally(err)
	}
	return ss
}

// lost ends the Session because one of its replicated sessions was lost,
// and closes the others on the cluster so their keys pass on at once.
func (s *Session) lost(err error) {
	s.closeInBackground(err, s.end(err))
}

// closeInBackground closes ss, replicated sessions of o that ended with
// err, on the cluster, so their keys pass on at once; not for an orphaned
// Session (its TTL decides) or when the node closes (Client.Close does it).
func (s *Session) closeInBackground(err error, ss []*ShardSession) {
	if s.c.stopped() || errors.Is(err, lockerr.Closed) || s.Orphaned() {
		return
	}
	for _, sh := range ss {
		s.c.cfg.Go(func(bg sess.Context) { _ = sh.closeOnCluster(bg) })
	}
}

// ShardSession is one replicated session, on one shard, of a Session: what
// holds its locks there. Its Lease says until when its locks may be relied
// on; a timer, and every Held.Done and Held.Err call, compare the
// deadline with the clock, and once it has passed the session is lost.
// Safe for concurrent use.
type ShardSession struct {
	c       *Client
	session *Session
	shard   uint64
	id      uint64

	// attempts are its request ids, the ones without their final answer
	// yet, and the keys being released.
	attempts *Attempts

	mu      sync.Mutex
	held    map[string][]*Held // held locks by key (several for shared or semaphore holds)
	lease   Lease
	timer   clock.Timer
	lost    chan struct{}
	lostErr error
}

// open opens a replicated session of owner on shard. Its lease counts
// from the moment the open was sent, as a keepalive's does.
func (c *Client) open(ctx sess.Context, owner *Session, shard uint64) (*ShardSession, error) {
	sent := c.now()
	cmd := lockfsm.Command{
		Op: lockfsm.OpOpenSession, Owner: c.cfg.Name, TTLMillis: uint64((owner.ttl + time.Millisecond - 1) / time.Millisecond),
	}
	if c.level().LabelsSessions() {
		cmd.Label = owner.label
	}
	res, err := c.cfg.Apply(ctx, shard, cmd)
	if err != nil {
		return nil, fmt.Errorf("open session on shard %d: %w", shard, err)
	}
	if res.Status != lockfsm.StatusOK {
		return nil, fmt.Errorf("open session on shard %d: %s", shard, Describe(res))
	}
	s := &ShardSession{
		c: c, session: owner, shard: shard, id: res.Session, attempts: NewAttempts(),
		held: map[string][]*Held{}, lost: make(chan struct{}),
		lease: NewLease(owner.ttl, Margin(owner.ttl, c.cfg.LeaseMargin), sent),
	}
	s.attempts.waiting = c.hooks.settling
	s.mu.Lock()
	s.armLocked()
	s.mu.Unlock()
	c.cfg.Log.Debug("session opened", "shard", shard, "session", s.id)
	return s, nil
}

// ID is the session's id in its shard.
func (s *ShardSession) ID() uint64 { return s.id }

// Shard is the shard the session lives in.
func (s *ShardSession) Shard() uint64 { return s.shard }

// Session is the Session the session belongs to.
func (s *ShardSession) Session() *Session { return s.session }

// Attempts is the session's request table.
func (s *ShardSession) Attempts() *Attempts { return s.attempts }

// Deadline is when the session's lease runs out, as it stands now.
func (s *ShardSession) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease.Deadline()
}

// Lost is closed once the session is lost; Err says why.
func (s *ShardSession) Lost() <-chan struct{} { return s.lost }

// Err returns nil while the session lives, then why it was lost.
func (s *ShardSession) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostErr
}

func (s *ShardSession) isLost() bool {
	select {
	case <-s.lost:
		return true
	default:
		return false
	}
}

// Extend records that a keepalive sent at sent was acknowledged: the
// deadline moves to sent + TTL - margin, never back. A lease whose
// deadline has already passed is never revived, even if its timer has not
// run yet: the session is lost now instead (see Lease.Extend).
func (s *ShardSession) Extend(sent time.Time) {
	s.mu.Lock()
	if s.lostErr != nil {
		s.mu.Unlock()
		return
	}
	if s.lease.Extend(sent, s.c.now()) {
		s.armLocked()
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.CheckDeadline()
}

// armLocked sets the deadline timer to the deadline as the clock reads
// now. s.mu must be held.
func (s *ShardSession) armLocked() {
	wait := s.lease.Deadline().Sub(s.c.now())
	if s.timer == nil {
		s.timer = s.c.cfg.Clock.AfterFunc(wait, s.onTimer)
	} else {
		s.timer.Reset(wait)
	}
}

// onTimer fires at the deadline as the clock stood when it was set; if the
// lease was extended meanwhile, or the clock says otherwise, it re-arms.
func (s *ShardSession) onTimer() {
	s.CheckDeadline()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lostErr == nil {
		s.timer.Reset(max(s.lease.Deadline().Sub(s.c.now()), time.Millisecond))
	}
}

// CheckDeadline loses the session if its deadline has passed; it runs from
// the deadline timer and from every Held.Done and Held.Err call, so that a
// holder that was paused past its deadline learns it on waking, whether or
// not the timer has run yet.
func (s *ShardSession) CheckDeadline() {
	s.mu.Lock()
	if s.lostErr != nil || !s.lease.Passed(s.c.now()) {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.Lose(lose(LossDeadline, fmt.Errorf("%w: keepalives on shard %d not acknowledged within the session TTL of %v", lockerr.LeaseExpired, s.shard, s.session.ttl)))
}

// Lose ends the session on this side because it was lost, once, which
// ends its whole Owner: every lock it holds reports err on Done, and the
// session (with the Session's others) is closed on the cluster in the
// background so its locks are handed on without waiting for the TTL.
func (s *ShardSession) Lose(err error) {
	if s.loseLocally(err) {
		s.session.lost(err) // closes this one on the cluster with the others
	}
}

// loseLocally ends the session on this side, once: its locks' Done close
// with err. It reports whether this call ended it.
func (s *ShardSession) loseLocally(err error) bool {
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
	held := s.held
	s.held = map[string][]*Held{}
	s.mu.Unlock()
	locks := 0
	for _, hs := range held {
		for _, h := range hs {
			close(h.unlisted)
			h.claim(err)
		}
		locks += len(hs)
	}
	level := s.c.cfg.Log.Warn
	if errors.Is(err, lockerr.SessionClosed) || errors.Is(err, lockerr.Closed) {
		level = s.c.cfg.Log.Debug
	} else if s.c.cfg.OnLost != nil {
		s.c.cfg.OnLost(s.shard, locks, LossReason(err))
	}
	level("session ended", "shard", s.shard, "session", s.id, "locks", locks, "err", err)
	return true
}

// closeOnCluster closes the session on the cluster so its locks are handed
// on without waiting for the leader to expire it. A close that cannot
// commit (the shard has no quorum) is tried again, a TTL at a time, until
// it lands or ctx ends or the node stops: when the quorum returns, the
// keys are freed at the next try instead of a full TTL after the new
// leader's grace. It returns the last error when it gives up.
func (s *ShardSession) closeOnCluster(ctx sess.Context) error {
	for try := 1; ; try++ {
		tctx, cancel := sess.WithTimeout(ctx, s.session.ttl)
		_, err := s.c.cfg.Apply(tctx, s.shard, lockfsm.Command{Op: lockfsm.OpCloseSession, Session: s.id})
		cancel()
		if err == nil || ctx.Err() != nil || s.c.stopped() {
			return err
		}
		if !errors.Is(err, lockerr.Unavailable) && !errors.Is(err, sess.DeadlineExceeded) {
			s.c.cfg.Log.Warn("session close failed", "shard", s.shard, "session", s.id, "err", err)
			return err
		}
		s.c.cfg.Log.Info("session close not committed yet; trying again", "shard", s.shard, "session", s.id, "try", try, "err", err)
	}
}

// Describe names an unexpected result for an error text or a log line,
// by status name ("Invalid"), not number.
func Describe(r lockfsm.Result) string {
	if r.Err != "" {
		return fmt.Sprintf("status %v: %s", r.Status, r.Err)
	}
	return fmt.Sprintf("status %v", r.Status)
}

// Why a session is lost, as LossReason names it.
const (
	// LossExpired: the cluster no longer counts the session as live (its
	// leader said so, or the shard no longer knows it).
	LossExpired = "expired"
	// LossDeadline: keepalives went unacknowledged until the lease ran
	// out on this peer's clock.
	LossDeadline = "lease_timeout"
	// LossUnsettled: a release or the withdrawal of an abandoned attempt
	// could not commit, so the session was given up to free its keys.
	LossUnsettled = "unsettled"
	// LossOther: any other cause (a caller's Lose).
	LossOther = "other"
)

// loss is an error that ends a session, with the reason.
type loss struct {
	reason string
	err    error
}

func (l *loss) Error() string { return l.err.Error() }
func (l *loss) Unwrap() error { return l.err }

// lose tags err, which ends a session, with reason.
func lose(reason string, err error) error { return &loss{reason: reason, err: err} }

// LossReason returns the reason a session ended with err: one of the Loss
// constants.
func LossReason(err error) string {
	if l, ok := errors.AsType[*loss](err); ok {
		return l.reason
	}
	return LossOther
}
