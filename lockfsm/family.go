package lockfsm

import (
	"fmt"
)

// The lock family: read/write locks, counting semaphores and
// all-or-nothing groups of acquires, with refusals that name the holders
// and waits refused when they would close a cycle. Every rule here is
// decided by the entry alone (its commands' Kind, Group and Flags, written
// only from feature level 3 on), never by the release applying it, so
// replicas of different releases that can read an entry apply it alike.

// Kind is what an Acquire asks of its key (Command.Kind).
type Kind uint8

// Acquire kinds.
const (
	// KindMutex holds a mutex key, with up to Limit holders (0 means 1):
	// the only kind before feature level 3.
	KindMutex Kind = iota
	// KindRead holds a read/write key shared with other readers.
	KindRead
	// KindWrite holds a read/write key alone.
	KindWrite
	// KindSemaphore holds Permits of a semaphore key's Limit permits.
	KindSemaphore

	maxKind = KindSemaphore
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case KindMutex:
		return "mutex"
	case KindRead:
		return "read"
	case KindWrite:
		return "write"
	case KindSemaphore:
		return "semaphore"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// role is what a key is while anybody holds or waits for it.
type role uint8

const (
	roleMutex role = iota
	roleRW
	roleSemaphore
)

func roleOf(k Kind) role {
	switch k {
	case KindRead, KindWrite:
		return roleRW
	case KindSemaphore:
		return roleSemaphore
	}
	return roleMutex
}

// kindName is the kind that names the role in KeyInfo.Role.
func (r role) kindName() Kind {
	switch r {
	case roleRW:
		return KindWrite
	case roleSemaphore:
		return KindSemaphore
	}
	return KindMutex
}

func (r role) String() string {
	switch r {
	case roleRW:
		return "read/write lock"
	case roleSemaphore:
		return "semaphore"
	}
	return "mutex"
}

// Flags ask more of an Acquire (Command.Flags).
type Flags uint8

const (
	// FlagDetail answers a refused Acquire (StatusLocked) with the key's
	// holders (Result.Holders), so the caller needs no second read.
	FlagDetail Flags = 1 << iota
	// FlagDeadlock refuses, with StatusDeadlock, an Acquire that would
	// wait for ever: its session counts as one thread of control, which
	// releases nothing while it waits, and so does every session waiting
	// with the flag; every other session is taken to release what it
	// holds, some time. The check plays the queues forward under those
	// rules (see deadlock.go), so a cycle through a holder, a waiter
	// queued ahead, a group or a semaphore's permits — the session's own
	// included — is refused, and a wait that some release would end is
	// not. Err names the cycle by Session label.
	FlagDeadlock

	knownFlags = FlagDetail | FlagDeadlock
)

// Limits of the lock family.
const (
	// MaxGroup is the most Acquires one all-or-nothing group may hold.
	MaxGroup = 64
	// maxDetailHolders is the most holders a refusal names.
	maxDetailHolders = 16
	// maxCycleSearch bounds the keys and sessions a deadlock check
	// plays; a check that would need more refuses nothing.
	maxCycleSearch = 4096
	// maxPlayAttempts bounds the holders and waiters a deadlock check
	// plays; a check that would need more refuses nothing.
	maxPlayAttempts = 16384
)

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
	at := &attempt{key: c.Key, last: c.Req, kind: c.Kind, permits: 1, deadlock: c.Flags&FlagDeadlock != 0}
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

// broken switches on deliberately broken grant rules, which the checkers
// of this package's tests must catch. Tests alone set it.
var broken struct {
	readerJoinsWriter bool // a reader joins a writer
	semaphoreOverfill bool // a semaphore grants past its permits
	groupPiecemeal    bool // a group's head is granted without the rest
	// The deadlock check lets a new wait jump the queues it joins, so it
	// misses a cycle through a waiter ahead of it (issue 31's first case).
	deadlockIgnoresQueue bool
	// The cross-shard play takes each shard's session for a thread of
	// its own, not each Session label: it sees no cycle across shards.
	crossShardBySession bool
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
		return at.kind == KindRead && (s.attemptOf(k.holders()[0]).kind == KindRead || broken.readerJoinsWriter)
	case roleSemaphore:
		return uint64(s.used(k))+uint64(at.permits) <= uint64(k.limit()) || broken.semaphoreOverfill && len(k.holders()) < 2
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

// groupReady reports whether every attempt of sess's group (first, size)
// waits at the head of its key's queue and can be granted there.
func (s *State) groupReady(sess *session, first uint64, size uint16) bool {
	for req := first; req < first+uint64(size); req++ {
		at := sess.reqs[req]
		if at == nil || at.state != ReqWaiting {
			return false
		}
		k := s.keys[at.key]
		if w := k.waiters(); w[0].session != sess.id || w[0].req != req || !s.canGrant(k, at) {
			return false
		}
	}
	return true
}

// acquireGroup applies the group of Acquires that starts at cmds[0] and
// writes their results; it returns how many commands it consumed. The
// group is cmds[0] and the commands after it that continue it (same
// Session and Group, the next Req, an Acquire), up to Group of them; if
// fewer continue it, or they are not all new and valid, every one gets
// the refusal and nothing changes. A group is granted whole in this entry
// when every key is free for it, else refused whole (Wait false), else
// queued whole, each attempt at the tail of its key's queue; it is then
// granted when all its attempts stand at their queues' heads and can be
// granted there (handOff), in one entry.
func (a *applier) acquireGroup(cmds []Command, results []Result) int {
	first := &cmds[0]
	n := 1
	for n < len(cmds) && n < int(first.Group) {
		c := &cmds[n]
		if c.Op != OpAcquire || c.Session != first.Session || c.Group != first.Group || c.Req != first.Req+uint64(n) {
			break
		}
		n++
	}
	refuse := func(r Result) int {
		for i := range n {
			results[i] = r
		}
		return n
	}
	switch {
	case first.Group < 2 || first.Group > MaxGroup:
		return refuse(invalid(fmt.Sprintf("Acquire: a group of %d; groups hold 2 to %d acquires", first.Group, MaxGroup)))
	case n < int(first.Group):
		return refuse(invalid(fmt.Sprintf("Acquire: group of %d at request %d has only %d acquires in its entry", first.Group, first.Req, n)))
	case first.Req > first.Req+uint64(n-1):
		return refuse(invalid("Acquire: group request ids overflow"))
	}
	sess := a.s.sessions[first.Session]
	if sess == nil {
		return refuse(Result{Status: StatusNoSession})
	}
	if first.Ack > sess.ack {
		sess.ack = first.Ack
		sess.prune()
	}
	group := cmds[:n]
	if sess.reqs[first.Req] != nil {
		// A retry: every attempt answers from its record.
		for i := range group {
			at := sess.reqs[group[i].Req]
			if at == nil || at.size != first.Group || at.first(group[i].Req) != first.Req {
				results[i] = invalid(fmt.Sprintf("Acquire: request id %d does not continue the group at %d as recorded", group[i].Req, first.Req))
				continue
			}
			results[i] = repeat(at, &group[i])
		}
		return n
	}
	keys := make([]*lockKey, n)
	for i := range group {
		c := &group[i]
		if c.Wait != first.Wait {
			return refuse(invalid("Acquire: the acquires of a group must all wait or all not"))
		}
		if err := ValidateKey(c.Key); err != nil {
			return refuse(invalid("Acquire: " + err.Error()))
		}
		if c.Req == 0 {
			return refuse(invalid("Acquire: request id must be > 0"))
		}
		if c.Req < sess.ack || sess.reqs[c.Req] != nil {
			return refuse(invalid(fmt.Sprintf("Acquire: group request id %d is used or below the acknowledged id %d", c.Req, sess.ack)))
		}
		for j := range i {
			if group[j].Key == c.Key {
				return refuse(invalid(fmt.Sprintf("Acquire: key %q twice in one group", c.Key)))
			}
		}
		k, res, ok := a.s.checkAcquire(c)
		if !ok {
			return refuse(res)
		}
		keys[i] = k
	}

	ats := make([]*attempt, n)
	free := true
	for i := range group {
		c := &group[i]
		ats[i] = newAttempt(c)
		ats[i].size, ats[i].offset = first.Group, uint8(i)
		if keys[i] == nil {
			keys[i] = newLockKey(limitOf(c), roleOf(c.Kind))
			a.s.keys[c.Key] = keys[i]
		}
		free = free && len(keys[i].waiters()) == 0 && a.s.canGrant(keys[i], ats[i])
	}
	for i := range group {
		sess.reqs[group[i].Req] = ats[i]
	}
	switch {
	case free:
		for i := range group {
			a.s.noteMaxHold(sess.id, &group[i])
			a.grant(group[i].Key, keys[i], sess, group[i].Req, ats[i], false)
			results[i] = Result{Status: StatusGranted, Token: ats[i].token}
		}
	case !first.Wait:
		for i := range group {
			sess.finish(group[i].Req, ats[i], ReqRejected)
			results[i] = Result{Status: StatusLocked}
			if group[i].Flags&FlagDetail != 0 {
				results[i].Holders = a.s.holders(keys[i].holders(), maxDetailHolders)
			}
			a.dropIfIdle(group[i].Key, keys[i])
		}
	default:
		if first.Flags&FlagDeadlock != 0 {
			reqs := make([]uint64, len(group))
			for i := range group {
				reqs[i] = group[i].Req
			}
			if why := a.s.deadlock(sess, reqs, ats); why != "" {
				for i := range group {
					sess.finish(group[i].Req, ats[i], ReqRejected)
					results[i] = Result{Status: StatusDeadlock, Err: fmt.Sprintf("Acquire of a group at %q: waiting would deadlock: %s", first.Key, why)}
					a.dropIfIdle(group[i].Key, keys[i])
				}
				return n
			}
		}
		for i := range group {
			a.s.noteMaxHold(sess.id, &group[i])
			a.enqueue(keys[i], sess, group[i].Req, ats[i])
			results[i] = Result{Status: StatusQueued}
		}
	}
	return n
}

// Units splits a batch into what must stay together: each command on its
// own, but the commands of a group (Command.Group) as one unit, as
// acquireGroup will read them. A router that re-batches forwarded
// commands keeps each unit whole and in order.
func Units(cmds []Command) [][]Command {
	var units [][]Command
	for i := 0; i < len(cmds); {
		n := 1
		if c := &cmds[i]; c.Op == OpAcquire && c.Group > 1 {
			for n < int(c.Group) && i+n < len(cmds) {
				m := &cmds[i+n]
				if m.Op != OpAcquire || m.Session != c.Session || m.Group != c.Group || m.Req != c.Req+uint64(n) {
					break
				}
				n++
			}
		}
		units = append(units, cmds[i:i+n:i+n])
		i += n
	}
	return units
}
