package lockfsm

import (
	"fmt"
)

// The rules every Acquire is checked and granted by: the limit a key
// takes from the Acquire that makes it, the checks of a new Acquire
// against its key, and whether an attempt can join its key's holders.

// limitOf is the limit an Acquire gives a key it creates: a semaphore's
// permit count, a mutex's holder count (0 means 1), 1 for a read/write key
// (whose readers the role rules count, not the limit).
func limitOf(c *Command) uint32 {
	if c.Kind == KindRead || c.Kind == KindWrite || c.Limit == 0 {
		return 1
	}
	return c.Limit
}

// newAttempt is the record of the new Acquire c.
func newAttempt(c *Command) *attempt {
	at := &attempt{key: c.Key, last: c.Req, kind: c.Kind, permits: 1, deadlock: c.Flags&FlagDeadlock != 0, priority: c.Priority}
	if c.Kind == KindSemaphore && c.Permits > 0 {
		at.permits = c.Permits
	}
	return at
}

// checkAcquire checks a new Acquire c against its own fields and its key,
// and returns the key (nil if nobody holds or waits for it). When ok is
// false, res is the refusal and nothing changed.
func (s *State) checkAcquire(c *Command) (k *lockKey, res Result, ok bool) {
	if c.Kind > maxKind {
		return nil, invalid(fmt.Sprintf("Acquire: unknown kind %d", c.Kind)), false
	}
	if c.Flags&^knownFlags != 0 {
		return nil, invalid(fmt.Sprintf("Acquire: unknown flags %#x", uint8(c.Flags&^knownFlags))), false
	}
	if c.Priority != 0 && (c.Flags&FlagDeadlock != 0 || c.Group != 0) {
		return nil, invalid(fmt.Sprintf("Acquire %q: a prioritized wait is neither deadlock-checked nor in a group", c.Key)), false
	}
	switch c.Kind {
	case KindRead, KindWrite:
		if c.Limit > 1 || c.Permits != 0 {
			return nil, invalid(fmt.Sprintf("Acquire %q: a %s lock takes no limit or permits", c.Key, c.Kind)), false
		}
	case KindSemaphore:
		if c.Limit == 0 {
			return nil, invalid(fmt.Sprintf("Acquire %q: a semaphore needs its permit count (Limit)", c.Key)), false
		}
		if n := max(c.Permits, 1); n > c.Limit {
			return nil, invalid(fmt.Sprintf("Acquire %q: %d permits asked of a semaphore of %d", c.Key, n, c.Limit)), false
		}
	default:
		if c.Permits != 0 {
			return nil, invalid(fmt.Sprintf("Acquire %q: a mutex takes no permits", c.Key)), false
		}
	}
	k = s.keys[c.Key]
	if k == nil {
		return nil, Result{}, true
	}
	if r := roleOf(c.Kind); r != k.role() {
		return nil, Result{Status: StatusMismatch, Err: fmt.Sprintf("Acquire %q: the key is a %s, not a %s", c.Key, k.role(), r)}, false
	}
	if limit := limitOf(c); limit != k.limit() {
		if c.Kind == KindSemaphore {
			return nil, Result{Status: StatusLimitMismatch, Err: fmt.Sprintf("Acquire %q: a semaphore of %d permits asked, the key has %d", c.Key, limit, k.limit())}, false
		}
		// What every release before the lock family answered.
		return nil, invalid(fmt.Sprintf("Acquire: limit %d differs from the key's current limit %d", limit, k.limit())), false
	}
	return k, Result{}, true
}

// brokenRules are deliberately broken grant rules, which the checkers of
// this package's tests must catch. A State's are all off (State.broken);
// only this package's tests switch one on, in a State they made.
type brokenRules struct {
	readerJoinsWriter bool // a reader joins a writer
	semaphoreOverfill bool // a semaphore grants past its permits
	groupPiecemeal    bool // a group's head is granted without the rest
	// The deadlock check lets a new wait jump the queues it joins, so it
	// misses a cycle through a waiter ahead of it (issue 31's first case).
	deadlockIgnoresQueue bool
	// The cross-shard play takes each shard's session for a thread of
	// its own, not each Session label: it sees no cycle across shards.
	crossShardBySession bool
	// A SetValue of a hold that ended writes over the key's holder now:
	// a deposed leader's proclamation replaces its successor's.
	valueUnfenced bool
	// A hand-off's grant is not reported as an event: a watcher misses
	// the new holder.
	eventsMissHandOff bool
}

// canGrant reports whether the attempt at can join k's holders now,
// leaving the queue aside.
func (s *State) canGrant(k *lockKey, at *attempt) bool {
	switch k.role() {
	case roleRW:
		if len(k.holders()) == 0 {
			return true
		}
		// Holders are one writer or only readers; the first says which.
		return at.kind == KindRead && (s.attemptOf(k.holders()[0]).kind == KindRead || s.broken.readerJoinsWriter)
	case roleSemaphore:
		return uint64(s.used(k))+uint64(at.permits) <= uint64(k.limit()) || s.broken.semaphoreOverfill && len(k.holders()) < 2
	}
	return uint64(len(k.holders())) < uint64(k.limit())
}

// used is the permits k's holders hold (the number of holders, for the
// roles whose attempts take one).
func (s *State) used(k *lockKey) uint32 {
	if k.role() != roleSemaphore {
		return uint32(len(k.holders()))
	}
	var n uint32
	for _, h := range k.holders() {
		n += s.attemptOf(h).permits
	}
	return n
}

func (s *State) attemptOf(h ref) *attempt { return s.sessions[h.session].reqs[h.req] }

// lookup is attemptOf for an attempt that may not exist: nil then, as for
// a state Verify would refuse (Save still writes it as it is) or one
// being decoded.
func (s *State) lookup(h ref) *attempt {
	if sess := s.sessions[h.session]; sess != nil {
		return sess.reqs[h.req]
	}
	return nil
}

// tokenOf returns the token of the attempt h, 0 if there is no such attempt.
func (s *State) tokenOf(h ref) uint64 {
	if at := s.lookup(h); at != nil {
		return at.token
	}
	return 0
}
