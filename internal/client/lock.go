package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Held is the client side of a held lock (node.Lock): the attempt that
// was granted, its fencing token, and whether this holder may still rely
// on it. Safe for concurrent use.
type Held struct {
	s     *ShardSession
	key   string
	req   uint64
	token uint64
	spec  Spec
	// holdDeadline is when this holder stops relying on a grant with a
	// maximum hold (Spec.MaxHold): zero for none.
	holdDeadline time.Time
	// holds counts the holds of a reentrant Session on this grant (1 for
	// the first); guarded by mu. Once the last is left the grant is
	// ending: nothing may re-enter it.
	holds int
	// unlisted is closed once the grant is no longer listed in its
	// session's held locks: its release is registered by then (an
	// acquire of the key waits for it), or the session is lost.
	unlisted chan struct{}

	once  sync.Once
	done  chan struct{}
	mu    sync.Mutex
	err   error
	after []func() // AfterDone's, run once done closes; guarded by mu
}

// newHeld records the grant of attempt req on key; if the session was
// lost meanwhile, the lock comes back already ended with its error.
//
// A grant with a maximum hold is relied on until since (the send time of
// the last request that found the attempt not yet granted: its Acquire,
// or a later read) plus the maximum, less the lease margin: the leader
// counts the maximum from when it first sees the grant, which is later.
func (s *ShardSession) newHeld(key string, req, token uint64, spec Spec, since time.Time) *Held {
	h := &Held{s: s, key: key, req: req, token: token, spec: spec, holds: 1, unlisted: make(chan struct{}), done: make(chan struct{})}
	if spec.MaxHold > 0 {
		h.holdDeadline = since.Add(spec.MaxHold - Margin(spec.MaxHold, s.c.cfg.LeaseMargin))
	}
	s.mu.Lock()
	err := s.lostErr
	if err == nil {
		s.held[key] = append(s.held[key], h)
	}
	s.mu.Unlock()
	if err != nil {
		close(h.unlisted) // never listed
		h.claim(err)
		return h
	}
	if !h.holdDeadline.IsZero() {
		s.c.cfg.Clock.AfterFunc(h.holdDeadline.Sub(s.c.now()), h.checkHold)
	}
	return h
}

// checkHold ends a grant held for its maximum: Done closes with
// lockerr.LeaseExpired, and the release is committed in the background,
// so the key passes on without waiting for the leader's ExpireHold. It
// re-arms when the clock says the deadline is still ahead.
func (h *Held) checkHold() {
	now := h.s.c.now()
	if now.Before(h.holdDeadline) {
		select {
		case <-h.done:
		default:
			h.s.c.cfg.Clock.AfterFunc(max(h.holdDeadline.Sub(now), time.Millisecond), h.checkHold)
		}
		return
	}
	err := fmt.Errorf("%w: %q was held for its maximum of %v (WithMaxHold)", lockerr.LeaseExpired, h.key, h.spec.MaxHold)
	if h.claim(err) {
		h.releaseInBackground()
	}
}

// heldOf returns s's hold of key, or nil. It looks the key up: a scan of
// every held lock made taking locks slower with each one held (at 500k
// held locks, three quarters of a peer's CPU).
func (s *ShardSession) heldOf(key string) *Held {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hs := s.held[key]; len(hs) > 0 {
		return hs[0]
	}
	return nil
}

// listedHold returns s's holds of key as listed now: the first that has
// ended or is ending (see Held.ending), and the first that is live.
func (s *ShardSession) listedHold(key string) (ending, live *Held) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.held[key] {
		switch {
		case h.ending():
			if ending == nil {
				ending = h
			}
		case live == nil:
			live = h
		}
	}
	return ending, live
}

// liveHold returns s's live hold of key, or nil if it has none. A hold
// that has ended or is ending (its last hold left, or its Done closed) is
// not one: liveHold waits until it is unlisted, by then with its release
// registered, which the caller then waits for (Attempts.AwaitRelease), so
// that an acquire of the key takes it anew rather than re-enter a grant
// on its way out or be told the key is held. lost is true when the
// session was lost meanwhile.
func (s *ShardSession) liveHold(ctx context.Context, key string) (live *Held, lost bool, err error) {
	for {
		ending, live := s.listedHold(key)
		if ending == nil {
			return live, false, nil
		}
		if f := s.c.hooks.settling; f != nil {
			f(key)
		}
		select {
		case <-ending.unlisted:
		case <-s.lost:
			return nil, true, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// dropHeld forgets h as held, if it is listed. s.mu is held.
func (s *ShardSession) dropHeld(h *Held) {
	i := slices.Index(s.held[h.key], h)
	if i < 0 {
		return // the session was lost, which unlisted it
	}
	if hs := slices.Delete(s.held[h.key], i, i+1); len(hs) == 0 {
		delete(s.held, h.key)
	} else {
		s.held[h.key] = hs
	}
	close(h.unlisted)
}

// Spec is what an acquire asks of its key (lockfsm.Command's Kind,
// Limit, Permits and Flags); the zero Spec is the mutex of every feature
// level.
type Spec struct {
	Kind    lockfsm.Kind
	Limit   uint32 // a semaphore's permit count; 1 otherwise
	Permits uint32 // of a semaphore; 0 means 1
	Flags   lockfsm.Flags
	// MaxHold, when > 0, is the longest the grant may be held: the
	// cluster ends it then (lockfsm.Command.MaxHoldMillis), and this side
	// stops relying on it a margin before.
	MaxHold time.Duration
	// Value is the attempt's value (lockfsm.Command.Value): its holder's
	// word on its hold, which reads of the key return.
	Value []byte
	// Priority orders its wait (lockfsm.Command.Priority).
	Priority uint8
}

// Spec returns what the grant was asked as, with the value its last
// SetValue set.
func (h *Held) Spec() Spec {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.spec
}

// Reenter counts one more hold of h by its reentrant Session, and reports
// false when h has ended or is ending (see ending): the caller then waits
// for its release and acquires anew.
func (h *Held) Reenter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holds == 0 || h.err != nil {
		return false
	}
	h.holds++
	return true
}

// ending reports whether h has ended or is on its way out: its last hold
// was left (Leave), so its holder is releasing it, or its Done closed.
// Either way its release follows, and nothing may re-enter it.
func (h *Held) ending() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.holds == 0 || h.err != nil
}

// Leave gives up one hold of a reentrant grant and reports whether it
// was the last, which the caller then releases: from then on the grant
// is ending, and a re-lock waits for the release and takes the key anew.
func (h *Held) Leave() (last bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.holds > 0 {
		h.holds--
	}
	return h.holds == 0
}

// Shard returns the shard of the locked key.
func (h *Held) Shard() uint64 { return h.s.shard }

// Key returns the locked key.
func (h *Held) Key() string { return h.key }

// Token returns the grant's fencing token.
func (h *Held) Token() uint64 { return h.token }

// Req returns the request id of the granted attempt.
func (h *Held) Req() uint64 { return h.req }

// Session returns the replicated session that holds the lock.
func (h *Held) Session() *ShardSession { return h.s }

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
	if !h.holdDeadline.IsZero() && !h.s.c.now().Before(h.holdDeadline) {
		h.checkHold()
	}
}

// claim closes Done with err and reports whether this call did it, so
// that of two racing ends of a lock exactly one acts on it.
func (h *Held) claim(err error) (won bool) {
	h.once.Do(func() {
		won = true
		h.mu.Lock()
		h.err = err
		close(h.done)
		after := h.after
		h.after = nil
		h.mu.Unlock()
		for _, f := range after {
			f()
		}
	})
	return won
}

// AfterDone runs f once Done has closed, at once if it has: a holder of
// several locks (node.MultiLock) learns of the first to end without a
// goroutine per lock. f must not block.
func (h *Held) AfterDone(f func()) {
	h.mu.Lock()
	select {
	case <-h.done:
		h.mu.Unlock()
		f()
		return
	default:
	}
	h.after = append(h.after, f)
	h.mu.Unlock()
}

// SetValue replaces the grant's value in the cluster (lockfsm.OpSetValue),
// fenced on the grant: the cluster takes it only while this grant holds
// the key, so a holder that lost it never writes over its successor's
// value. A lock this side no longer relies on (Done closed) fails with
// its error, before anything is sent; one the cluster says it no longer
// holds, with lockerr.NotHeld. The value is what the holder's Spec.Value
// was at once: the Held's Spec reports it.
func (h *Held) SetValue(ctx context.Context, v []byte) error {
	if err := h.Err(); err != nil {
		return fmt.Errorf("set the value of %q: %w", h.key, err)
	}
	s := h.s
	if l := s.c.level(); !l.HasCoordination() {
		return fmt.Errorf("set the value of %q: %w: values on holds need feature level %d; the cluster runs at %d until every peer is upgraded (see docs/UPGRADING.md)",
			h.key, lockerr.Incompatible, level.Coordination, l)
	}
	req := s.attempts.Begin()
	defer s.attempts.Finish(req)
	v = slices.Clone(v)
	res, err := s.c.cfg.Apply(ctx, s.shard, lockfsm.Command{Op: lockfsm.OpSetValue, Session: s.id, Req: req, Ack: s.attempts.Ack(), Target: h.req, Value: v})
	if err != nil {
		return fmt.Errorf("set the value of %q: %w", h.key, err)
	}
	switch res.Status {
	case lockfsm.StatusOK:
		h.mu.Lock()
		h.spec.Value = v
		h.mu.Unlock()
		return nil
	case lockfsm.StatusNotHeld, lockfsm.StatusNoSession:
		return fmt.Errorf("set the value of %q: %w: the cluster no longer counts this grant (token %d) a holder", h.key, lockerr.NotHeld, h.token)
	default:
		return fmt.Errorf("set the value of %q: %s", h.key, Describe(res))
	}
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
// needs to read it). An acquire of the same key through the same session
// waits for it: the release is registered before the hold is unlisted,
// under the session's lock, so an acquire that no longer finds the hold
// finds the release. A release that does not commit loses the session:
// its keepalives would otherwise keep the key held for as long as this
// peer lives.
func (h *Held) releaseInBackground() <-chan outcome {
	s := h.s
	out := make(chan outcome, 1)
	s.mu.Lock()
	done := s.attempts.StartRelease(h.key)
	s.dropHeld(h)
	s.mu.Unlock()
	if f := s.c.hooks.unlisted; f != nil {
		f(h)
	}
	s.c.cfg.Go(func(bg context.Context) {
		defer s.attempts.EndRelease(h.key, done)
		ctx, cancel := context.WithTimeout(bg, s.session.ttl)
		defer cancel()
		res, err := s.release(ctx, h.req)
		out <- outcome{res: res, err: err}
		if err != nil && !s.c.stopped() {
			s.Lose(lose(LossUnsettled, fmt.Errorf("%w: release of %q on shard %d did not commit: %v", lockerr.LeaseExpired, h.key, s.shard, err)))
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
func (s *ShardSession) ReleaseCommand(target uint64) (cmd lockfsm.Command, done func()) {
	req := s.attempts.Begin()
	cmd = lockfsm.Command{Op: lockfsm.OpRelease, Session: s.id, Req: req, Target: target, Ack: s.attempts.Ack()}
	return cmd, func() { s.attempts.Finish(req) }
}

// release commits the release of the attempt target, retrying idempotently
// until ctx ends.
func (s *ShardSession) release(ctx context.Context, target uint64) (lockfsm.Result, error) {
	cmd, done := s.ReleaseCommand(target)
	defer done()
	return s.c.cfg.Apply(ctx, s.shard, cmd)
}

// Acquire takes key, which lives in shard, for the Session as spec asks:
// in its replicated session there (opened if needed), after the
// session's own releases of key in flight, and its withdrawals of
// abandoned attempts on key, have committed. With wait it queues behind
// the key's holders and waiters (FIFO) until granted or ctx ends;
// without, a key it cannot take now fails at once with a
// *lockerr.LockedError.
//
// A key the Session holds already fails at once with lockerr.AlreadyHeld,
// unless the Session is a shared default one (its other holder is another
// caller), the key is a semaphore's (each take of permits is a grant of
// its own), or the Session is reentrant and the hold is of the same kind
// (then the same grant is returned, with one more hold). A hold that has
// ended or is ending (its last hold left, its maximum hold reached) is no
// longer held: Acquire waits for its release and takes the key anew.
//
// retry is true, with a nil lock and error, when the Session's session was
// lost on the way: the caller starts over in a live Session, or reports the
// Session's error. When ctx ends first, the attempt leaves the queue (a
// grant that raced it is released) and a *WaitError wrapping ctx's error
// is returned.
func (s *Session) Acquire(ctx context.Context, shard uint64, key string, wait bool, spec Spec) (h *Held, retry bool, err error) {
	sh, err := s.OnShard(ctx, shard)
	if err != nil {
		if s.Err() != nil {
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("lock %q: %w", key, err)
	}
	for {
		held, lost, err := sh.liveHold(ctx, key)
		if lost {
			return nil, true, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("lock %q: wait for this session's hold to be given up: %w", key, err)
		}
		// A semaphore's permits may be taken several times over by one
		// Session, each take its own grant, as its goroutines would.
		if held == nil || s.shared || spec.Kind == lockfsm.KindSemaphore {
			break
		}
		if !s.reentrant {
			// It would queue behind itself until ctx ends.
			return nil, false, fmt.Errorf("lock %q: %w: unlock it first, lock it through another Session, or make the Session reentrant (WithReentrant)", key, lockerr.AlreadyHeld)
		}
		if held.spec.Kind != spec.Kind {
			return nil, false, fmt.Errorf("lock %q: %w as a %v lock; a reentrant Session re-enters only the kind it holds: unlock it first, or lock it through another Session", key, lockerr.AlreadyHeld, held.spec.Kind)
		}
		if held.Reenter() {
			return held, false, nil
		}
		// Its last hold was left since liveHold looked: wait it out.
	}
	if err := sh.attempts.AwaitRelease(ctx, key, sh.lost); err != nil {
		return nil, false, fmt.Errorf("lock %q: wait for this session's release: %w", key, err)
	}
	if sh.isLost() {
		return nil, true, nil
	}
	hs, retry, err := sh.attempt(ctx, []string{key}, []Spec{spec}, wait)
	if len(hs) == 0 {
		return nil, retry, err
	}
	return hs[0], false, nil
}

// AcquireAll takes keys, which all live in shard, together for the
// Owner: in one Raft entry, all or none (an all-or-nothing group; see
// lockfsm.Command.Group, or a plain acquire for a single key), each as
// its spec asks. It fails as Acquire does, but is never reentrant: a key
// the Session holds already, as any kind, fails it at once with
// lockerr.AlreadyHeld, before anything is sent. When ctx ends first, the
// whole group leaves the queues, and a grant that raced it is released.
func (s *Session) AcquireAll(ctx context.Context, shard uint64, keys []string, specs []Spec, wait bool) (hs []*Held, retry bool, err error) {
	sh, err := s.OnShard(ctx, shard)
	if err != nil {
		if s.Err() != nil {
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("lock %q: %w", keys[0], err)
	}
	for _, key := range keys {
		held, lost, err := sh.liveHold(ctx, key)
		if lost {
			return nil, true, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("lock %q: wait for this session's hold to be given up: %w", key, err)
		}
		if held != nil && !s.shared {
			return nil, false, fmt.Errorf("lock %q: %w: unlock it first, or lock through another Session (LockAll never re-enters a key)", key, lockerr.AlreadyHeld)
		}
	}
	for _, key := range keys {
		if err := sh.attempts.AwaitRelease(ctx, key, sh.lost); err != nil {
			return nil, false, fmt.Errorf("lock %q: wait for this session's release: %w", key, err)
		}
	}
	if sh.isLost() {
		return nil, true, nil
	}
	return sh.attempt(ctx, keys, specs, wait)
}

// attempt makes one acquire attempt in s: of one key, or of an
// all-or-nothing group of keys in one entry. retry is true when the
// session was lost on the way.
func (s *ShardSession) attempt(ctx context.Context, keys []string, specs []Spec, wait bool) (hs []*Held, retry bool, err error) {
	c := s.c
	n := len(keys)
	first := s.attempts.BeginN(n)
	abandoned := false // an abandoned attempt stays pending until its cancel is in
	defer func() {
		if !abandoned {
			for i := range n {
				s.attempts.Finish(first + uint64(i))
			}
		}
	}()
	granted := make([]<-chan uint64, n)
	cmds := make([]lockfsm.Command, n)
	for i, key := range keys {
		req := first + uint64(i)
		waiter := WaiterKey{Shard: s.shard, Session: s.id, Req: req}
		granted[i] = c.waiters.Add(waiter)
		defer c.waiters.Remove(waiter)
		sp := specs[i]
		cmds[i] = lockfsm.Command{
			Op: lockfsm.OpAcquire, Session: s.id, Req: req, Ack: s.attempts.Ack(), Key: key, Wait: wait,
			Kind: sp.Kind, Limit: max(sp.Limit, 1), Permits: sp.Permits, Flags: sp.Flags,
			MaxHoldMillis: uint64((sp.MaxHold + time.Millisecond - 1) / time.Millisecond), // rounded up: the cluster waits longer
			Value:         sp.Value, Priority: sp.Priority,
		}
		if sp.Kind == lockfsm.KindRead || sp.Kind == lockfsm.KindWrite {
			cmds[i].Limit = 0
		}
		if n > 1 {
			cmds[i].Group = uint16(n)
		}
	}
	// since is the send time of the last request that found the attempt
	// not granted yet: a grant's maximum hold counts from there.
	since := c.now()
	var results []lockfsm.Result
	if n == 1 {
		var res lockfsm.Result
		res, err = c.cfg.Apply(ctx, s.shard, cmds[0])
		results = []lockfsm.Result{res}
	} else {
		results, err = c.cfg.ApplyGroup(ctx, s.shard, cmds)
	}
	if err != nil {
		if wait && ctx.Err() != nil {
			// ctx ended with the request in flight: it may have queued,
			// and it gave up waiting as it would have once queued.
			abandoned, err = s.giveUp(ctx, keys, first)
			return nil, false, err
		}
		abandoned = s.abandon(keys, first)
		return nil, false, fmt.Errorf("lock %q: %w", keys[0], err)
	}
	if len(results) != n {
		abandoned = s.abandon(keys, first)
		return nil, false, fmt.Errorf("lock %q: %d results for %d acquires", keys[0], len(results), n)
	}
	tokens := make([]uint64, n)
	queued := false
	for i, res := range results {
		switch res.Status {
		case lockfsm.StatusGranted:
			tokens[i] = res.Token
		case lockfsm.StatusQueued:
			queued = true
		case lockfsm.StatusNoSession:
			s.Lose(lose(LossExpired, fmt.Errorf("%w: shard %d no longer knows session %d", lockerr.LeaseExpired, s.shard, s.id)))
			return nil, true, nil
		case lockfsm.StatusLocked:
			// A refused group answers each of its keys Locked, the
			// free ones too: name a key somebody holds.
			for j := i; j < n; j++ {
				if results[j].Status == lockfsm.StatusLocked && len(results[j].Holders) > 0 {
					return nil, false, refusal(keys[j], results[j])
				}
			}
			return nil, false, refusal(keys[i], res)
		default:
			return nil, false, refusal(keys[i], res)
		}
	}
	if !queued {
		return s.newHelds(keys, first, tokens, specs, since), false, nil
	}
	if c.cfg.OnQueued != nil {
		c.cfg.OnQueued(ctx)
	}
	// A flagged wait may be refused by the cross-shard deadlock check
	// (Client.Waits): it then leaves the queue as one whose ctx ended.
	var refused <-chan error
	if specs[0].Flags&lockfsm.FlagDeadlock != 0 {
		ws := make([]WaiterKey, n)
		for i := range ws {
			ws[i] = WaiterKey{Shard: s.shard, Session: s.id, Req: first + uint64(i)}
		}
		var unwatch func()
		refused, unwatch = c.waits.add(s.session, ws, keys, time.Now())
		defer unwatch()
	}

	// Queued: wait for the grant (of every attempt of a group: they come
	// in one entry). A token comes from this peer's own replica; a
	// notice, or the slow re-read that covers lost notices, is checked
	// against the replicated state. The re-read is liveness, not lease
	// timing, so it runs on Go's timers.
	poll := time.NewTicker(s.session.ttl / 4)
	defer poll.Stop()
	missing := func() int {
		for i, t := range tokens {
			if t == 0 {
				return i
			}
		}
		return -1
	}
	for i := missing(); i >= 0; i = missing() {
		select {
		case tok := <-granted[i]:
			if tok != Verify {
				tokens[i] = tok
				continue
			}
		case <-poll.C:
		case <-s.lost:
			return nil, true, nil
		case <-ctx.Done():
			abandoned, err = s.giveUp(ctx, keys, first)
			return nil, false, err
		case err := <-refused:
			abandoned = s.abandon(keys, first)
			return nil, false, err
		case <-c.cfg.Stop:
			return nil, false, lockerr.Closed
		}
		for j := i; j < n; j++ {
			if tokens[j] != 0 {
				continue
			}
			sent := c.now()
			found, a, err := c.cfg.ReadAttempt(ctx, s.shard, s.id, first+uint64(j))
			if err != nil {
				break
			}
			if !found {
				s.Lose(lose(LossExpired, fmt.Errorf("%w: shard %d no longer knows session %d", lockerr.LeaseExpired, s.shard, s.id)))
				return nil, true, nil
			}
			if a.State != lockfsm.ReqHeld {
				if a.State == lockfsm.ReqWaiting {
					since = sent // not granted when this read was sent
				}
				break
			}
			tokens[j] = a.Token
		}
	}
	return s.newHelds(keys, first, tokens, specs, since), false, nil
}

// newHelds records the grants of the attempts from first.
func (s *ShardSession) newHelds(keys []string, first uint64, tokens []uint64, specs []Spec, since time.Time) []*Held {
	hs := make([]*Held, len(keys))
	for i, key := range keys {
		hs[i] = s.newHeld(key, first+uint64(i), tokens[i], specs[i], since)
	}
	return hs
}

// refusal is the error for an acquire the state machine refused.
func refusal(key string, res lockfsm.Result) error {
	switch res.Status {
	case lockfsm.StatusLocked:
		return &lockerr.LockedError{Key: key, Holders: res.Holders}
	case lockfsm.StatusDeadlock:
		return fmt.Errorf("lock %q: %w: %s", key, lockerr.Deadlock, res.Err)
	case lockfsm.StatusMismatch:
		return fmt.Errorf("lock %q: %w: %s", key, lockerr.KindMismatch, res.Err)
	case lockfsm.StatusLimitMismatch:
		return fmt.Errorf("lock %q: %w: %s", key, lockerr.LimitMismatch, res.Err)
	}
	return fmt.Errorf("lock %q: %s", key, Describe(res))
}

// abandon withdraws the acquire attempts on keys from first on (one
// attempt, or a group) whose caller gave up. Cancel dequeues each, or
// releases it if it was granted meanwhile, so an abandoned grant never
// leaks. It runs in the background, bounded by the session TTL, and
// reports whether it took over finishing the attempts.
//
// The withdrawal is registered with the keys' releases before abandon
// returns: a new acquire of any of the keys through this session waits
// for it to commit, as for a release. Sent at once, it would find the
// abandoned attempt still queued or granted, queue behind its own
// session, and, checked for deadlocks, be refused as waiting for itself.
//
// A cancel that does not commit in time loses the whole session, as a
// release that does not commit does: the session's keepalives would
// otherwise keep the abandoned request queued, or granted to nobody, for
// as long as this peer lives, and the key with it (seen under delay-drop).
// Losing the session closes it on the cluster, which ends the request.
func (s *ShardSession) abandon(keys []string, first uint64) bool {
	return s.withdraw(keys, first, s.startWithdrawal(keys))
}

// giveUp ends the wait of the attempts on keys from first on, whose ctx
// ended: it withdraws them in the background and returns their
// *WaitError, and whether they were abandoned (as withdraw says). The withdrawal
// is recorded before the keys are read for the error, so an acquire of
// a key through this session meanwhile waits for it (it would otherwise
// find its own attempt in the way).
func (s *ShardSession) giveUp(ctx context.Context, keys []string, first uint64) (abandoned bool, err error) {
	withdrawals := s.startWithdrawal(keys)
	err = s.waitError(ctx, keys, first)
	return s.withdraw(keys, first, withdrawals), err
}

// startWithdrawal records that the attempts on keys are being withdrawn,
// so that a new acquire of one of the keys through this session waits for
// the withdrawal (withdraw) to commit. nil when the Client has stopped.
func (s *ShardSession) startWithdrawal(keys []string) []chan struct{} {
	if s.c.stopped() {
		return nil
	}
	withdrawals := make([]chan struct{}, len(keys))
	for i, key := range keys {
		withdrawals[i] = s.attempts.StartRelease(key)
	}
	return withdrawals
}

// withdraw commits, in the background, the withdrawal startWithdrawal
// recorded (abandon).
func (s *ShardSession) withdraw(keys []string, first uint64, withdrawals []chan struct{}) bool {
	if withdrawals == nil {
		return false
	}
	s.c.cfg.Go(func(bg context.Context) {
		defer func() {
			for i, key := range keys {
				s.attempts.Finish(first + uint64(i))
				s.attempts.EndRelease(key, withdrawals[i])
			}
		}()
		ctx, cancel := context.WithTimeout(bg, s.session.ttl)
		defer cancel()
		// One cancel withdraws a whole waiting group; each releases its
		// own attempt if the group was granted meanwhile.
		for i := range keys {
			_, err := s.c.cfg.Apply(ctx, s.shard, lockfsm.Command{Op: lockfsm.OpCancel, Session: s.id, Target: first + uint64(i)})
			if err != nil && !s.c.stopped() {
				s.Lose(lose(LossUnsettled, fmt.Errorf("%w: withdrawal of an abandoned lock attempt on shard %d did not commit: %v", lockerr.LeaseExpired, s.shard, err)))
				return
			}
		}
	})
	return true
}

// WaitError is a waiting acquire that gave up because its ctx ended
// before the grant: it wraps ctx's error (it was not refused) and says
// what it waited behind, as one read of the key's state, bounded on its
// own, found it when the wait ended. node exports its own form.
type WaitError struct {
	Key string
	// Known is false when the key's state could not be read in time:
	// Holders and Ahead are then empty.
	Known bool
	// Holders held the key, in grant order; Ahead is how many waiters
	// were before this one in its queue.
	Holders []lockfsm.Holder
	Ahead   int
	Err     error // ctx's
}

func (e *WaitError) Error() string {
	if !e.Known {
		return fmt.Sprintf("lock %q: gave up waiting: %v", e.Key, e.Err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "lock %q: gave up waiting: %v; ", e.Key, e.Err)
	if len(e.Holders) == 0 {
		b.WriteString("no holders")
	} else {
		b.WriteString("held by ")
		for i, h := range e.Holders {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s (token %d)", h.Owner, h.Token)
		}
	}
	fmt.Fprintf(&b, ", %d waiting ahead", e.Ahead)
	return b.String()
}

// Unwrap returns ctx's error.
func (e *WaitError) Unwrap() error { return e.Err }

// waitError is the error of the wait of the attempts on keys from first
// on (one, or a group) whose ctx ended: a *WaitError with what a read of
// the keys' state finds, bounded by a quarter of the TTL and at most a
// second of its own (ctx is over). For a group it names the first key
// where somebody held it or waited ahead, or the first key if there is
// none (the group was granted or withdrawn meanwhile). A read that fails
// leaves the details out.
func (s *ShardSession) waitError(ctx context.Context, keys []string, first uint64) error {
	unknown := &WaitError{Key: keys[0], Err: ctx.Err()}
	if s.c.cfg.ReadKey == nil {
		return unknown
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(s.session.ttl/4, time.Second))
	defer cancel()
	var firstRead *WaitError
	for i, key := range keys {
		info, _, err := s.c.cfg.ReadKey(rctx, s.shard, key)
		if err != nil {
			return unknown
		}
		req := first + uint64(i)
		ahead := max(slices.IndexFunc(info.Waiters, func(w lockfsm.Holder) bool { return w.Session == s.id && w.Req == req }), 0)
		werr := &WaitError{Key: key, Known: true, Holders: info.Holders, Ahead: ahead, Err: ctx.Err()}
		if len(info.Holders) > 0 || ahead > 0 {
			return werr
		}
		if firstRead == nil {
			firstRead = werr
		}
	}
	return firstRead
}
