package lockfsm

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// The deadlock check (FlagDeadlock). A session that waits with the flag
// is one thread of control: while it waits it releases nothing. Every
// other session — one that waits for nothing, or only without the flag —
// is taken to release everything it holds, some time. A new wait is
// refused when, under those rules, it could never be granted: the check
// plays the shard's queues forward, with the grant rules Apply uses
// (FIFO, read/write sharing, semaphore permits, groups taken whole), and
// looks at whether the new attempt is still waiting when nothing more
// can move. That is exact for every role: a waiter queued behind a group
// that waits for the newcomer's key is a deadlock (an edge to holders
// alone misses it), while a semaphore waiter that needs only some
// holder's permits back is not (an edge to every holder would call it
// one); a session waiting for permits it holds itself waits for ever.
//
// Only the part of the shard the new wait can depend on is played: the
// keys it waits for, the sessions that hold or wait for them, and every
// key those sessions wait for, transitively. A check that would need
// more than maxCycleSearch keys and sessions, or maxPlayAttempts holders
// and waiters, refuses nothing. Each attempt costs the play O(1) (a key's
// holders are counted as they come and go), so a check costs
// O(maxPlayAttempts) at most, on every replica.
// Every step goes in a fixed order, so every replica refuses alike and
// names the same cycle.

// simAttempt is an attempt in the play: a holder or a waiter of a key.
type simAttempt struct {
	sess     *simSession
	id       attemptID
	req      uint64
	key      *simKey
	kind     Kind
	permits  uint32
	size     uint16 // of its group; 0 for none
	first    uint64 // its group's first request id
	held     bool
	released bool // held, then given back in the play
	flagged  bool // the wait counts: FlagDeadlock
}

// simSession is a session in the play.
type simSession struct {
	id      uint64
	owner   string
	label   uint64
	blocked int // flagged attempts still waiting; 0: it will release
	holds   []*simAttempt
	waits   []*simAttempt // by request id
	// group is its waiting attempts of groups, to find a group's
	// members; nil until it has one.
	group map[attemptID]*simAttempt
}

// waitsFor records sa as a waiting attempt of ss.
func (ss *simSession) waitsFor(sa *simAttempt) {
	ss.waits = append(ss.waits, sa)
	if sa.size != 0 {
		if ss.group == nil {
			ss.group = map[attemptID]*simAttempt{}
		}
		ss.group[sa.id] = sa
	}
}

// attemptID names an attempt in a play of one or several shards.
type attemptID struct{ shard, session, req uint64 }

// simKey is a key in the play.
type simKey struct {
	shard   uint64 // in a play of several shards
	name    string
	role    role
	limit   uint32
	holders []*simAttempt // in grant order; released ones stay, marked
	queue   []*simAttempt
	// What the holders not released hold, kept as they come and go so
	// that a key of many holders costs the play no rescans.
	held, writers int
	used          uint64 // permits
}

// hold adds sa to k's holders.
func (k *simKey) hold(sa *simAttempt) {
	sa.held = true
	k.holders = append(k.holders, sa)
	k.held++
	k.used += uint64(sa.permits)
	if sa.kind == KindWrite {
		k.writers++
	}
}

// release ends the hold sa of k.
func (k *simKey) release(sa *simAttempt) {
	sa.released = true
	k.held--
	k.used -= uint64(sa.permits)
	if sa.kind == KindWrite {
		k.writers--
	}
}

type deadlockPlay struct {
	s        *State
	sessions map[uint64]*simSession
	keys     map[string]*simKey
	order    []string // keys in the order the play met them
	work     []*simKey
	free     []*simSession
	attempts int // holders and waiters met
	broken   brokenRules
}

// deadlock reports why the new attempts of sess, none of them granted,
// could never be granted if they waited (as a group when there are two or
// more), or "" when they could or the check gave up. Nothing in the state
// changes.
func (s *State) deadlock(sess *session, reqs []uint64, ats []*attempt) string {
	p := &deadlockPlay{s: s, sessions: map[uint64]*simSession{}, keys: map[string]*simKey{}, broken: s.broken}
	me := p.session(sess)
	if me == nil {
		return ""
	}
	// The new attempts join the tails of their queues: the check is
	// whether they would ever leave them.
	var mine []*simAttempt
	for i, at := range ats {
		k := p.key(at.key)
		if k == nil {
			return ""
		}
		sa := p.attempt(me, reqs[i], at, k)
		sa.flagged = true
		k.queue = append(k.queue, sa)
		me.waitsFor(sa)
		me.blocked++
		mine = append(mine, sa)
	}
	if !p.closure() {
		return ""
	}
	p.play()
	if mine[0].held {
		return ""
	}
	why, _, _ := p.explain(me, mine)
	return why
}

// session adds sess to the play, with what it waits for, and returns it;
// nil when the play has grown past maxCycleSearch.
func (p *deadlockPlay) session(sess *session) *simSession {
	if ss := p.sessions[sess.id]; ss != nil {
		return ss
	}
	if len(p.sessions)+len(p.keys) >= maxCycleSearch {
		return nil
	}
	ss := &simSession{id: sess.id, owner: sess.owner, label: sess.label}
	p.sessions[sess.id] = ss
	return ss
}

// key adds the key named name to the play, with its holders and waiters
// in their order; nil when the play has grown past maxCycleSearch.
func (p *deadlockPlay) key(name string) *simKey {
	if k := p.keys[name]; k != nil {
		return k
	}
	if len(p.sessions)+len(p.keys) >= maxCycleSearch {
		return nil
	}
	k := &simKey{name: name, role: roleMutex, limit: 1}
	p.keys[name] = k
	p.order = append(p.order, name)
	if lk := p.s.keys[name]; lk != nil {
		k.role, k.limit = lk.role(), lk.limit()
	}
	return k
}

// attempt is the play's record of the attempt (ss, req).
func (p *deadlockPlay) attempt(ss *simSession, req uint64, at *attempt, k *simKey) *simAttempt {
	return &simAttempt{sess: ss, id: attemptID{0, ss.id, req}, req: req, key: k, kind: at.kind, permits: at.permits, size: at.size, first: at.first(req), flagged: at.deadlock}
}

// closure fills the play: every key met brings its holders and waiters,
// and every session met brings every key it waits for. It reports false
// when that grows past maxCycleSearch.
func (p *deadlockPlay) closure() bool {
	filled := map[uint64]bool{}
	for i := 0; i < len(p.order); i++ {
		name := p.order[i]
		k := p.keys[name]
		lk := p.s.keys[name]
		if lk == nil {
			continue
		}
		var sessions []*session
		var mine []*simAttempt // the new attempts, already queued
		mine, k.queue = k.queue, nil
		if p.attempts += len(lk.holders()) + len(lk.waiters()); p.attempts > maxPlayAttempts {
			return false
		}
		for j, list := range [][]ref{lk.holders(), lk.waiters()} {
			for _, h := range list {
				sess := p.s.sessions[h.session]
				ss := p.session(sess)
				if ss == nil {
					return false
				}
				sa := p.attempt(ss, h.req, sess.reqs[h.req], k)
				if j == 0 {
					k.hold(sa)
					ss.holds = append(ss.holds, sa)
				} else {
					k.queue = append(k.queue, sa)
					ss.waitsFor(sa)
					if sa.flagged {
						ss.blocked++
					}
				}
				sessions = append(sessions, sess)
			}
		}
		if p.broken.deadlockIgnoresQueue {
			k.queue = append(mine, k.queue...)
		} else {
			k.queue = append(k.queue, mine...)
		}
		// What the sessions met here wait for, in request id order.
		for _, sess := range sessions {
			if filled[sess.id] || sess.waiting == 0 {
				continue
			}
			filled[sess.id] = true
			for _, req := range sess.reqsIn(ReqWaiting) {
				if p.key(sess.reqs[req].key) == nil {
					return false
				}
			}
		}
	}
	for _, ss := range p.sessions {
		slices.SortFunc(ss.waits, func(a, b *simAttempt) int { return cmp.Compare(a.req, b.req) })
	}
	return true
}

// play releases what free sessions hold and grants what that frees, until
// nothing more moves.
func (p *deadlockPlay) play() {
	ids := make([]uint64, 0, len(p.sessions))
	for id := range p.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if ss := p.sessions[id]; ss.blocked == 0 {
			p.free = append(p.free, ss)
		}
	}
	for _, name := range p.order {
		p.work = append(p.work, p.keys[name])
	}
	for len(p.free) > 0 || len(p.work) > 0 {
		for len(p.free) > 0 {
			ss := p.free[0]
			p.free = p.free[1:]
			for _, h := range ss.holds {
				h.key.release(h)
				p.work = append(p.work, h.key)
			}
			ss.holds = nil
		}
		if len(p.work) > 0 {
			k := p.work[0]
			p.work = p.work[1:]
			p.handOff(k)
		}
	}
}

// handOff grants k's queue from its head, as applier.handOff does.
func (p *deadlockPlay) handOff(k *simKey) {
	for len(k.queue) > 0 {
		w := k.queue[0]
		if w.size == 0 {
			if !k.fits(w) {
				return
			}
			p.grant(w)
			continue
		}
		// A group the play could not take whole never leaves: graphs from
		// other peers (StuckWaits) may hold anything, and a head that
		// would never be popped must not spin.
		if w.size > MaxGroup || w.first > w.req || w.req-w.first >= uint64(w.size) {
			return
		}
		members := make([]*simAttempt, 0, w.size)
		for i := range uint64(w.size) {
			m := w.sess.group[attemptID{w.id.shard, w.id.session, w.first + i}]
			if m == nil || m.held || len(m.key.queue) == 0 || m.key.queue[0] != m || !m.key.fits(m) {
				return
			}
			members = append(members, m)
		}
		for _, m := range members {
			p.grant(m)
			if m.key != k {
				p.work = append(p.work, m.key)
			}
		}
	}
}

// grant makes the head of its key's queue a holder.
func (p *deadlockPlay) grant(w *simAttempt) {
	k := w.key
	k.queue = k.queue[1:]
	k.hold(w)
	ss := w.sess
	ss.holds = append(ss.holds, w)
	if w.flagged {
		if ss.blocked--; ss.blocked == 0 {
			p.free = append(p.free, ss)
		}
	} else if ss.blocked == 0 {
		p.free = append(p.free, ss)
	}
}

// fits reports whether w could join k's holders now, as State.canGrant.
func (k *simKey) fits(w *simAttempt) bool {
	switch k.role {
	case roleRW:
		return k.held == 0 || w.kind == KindRead && k.writers == 0
	case roleSemaphore:
		return k.used+uint64(w.permits) <= uint64(k.limit)
	}
	return uint64(k.held) < uint64(k.limit)
}

// explain names the wait-for path from me, whose new wait is stuck: each
// step is a session waiting for a key, held by, or queued behind, a
// session that is stuck too, until a session comes round again (me, when
// the new wait closes the cycle).
// It also returns the sessions of the cycle and its steps, in its order.
func (p *deadlockPlay) explain(me *simSession, mine []*simAttempt) (string, []*simSession, []hop) {
	var steps []hop
	var path []*simSession
	seen := map[*simSession]int{}
	at, waits := me, mine
	for {
		seen[at] = len(steps)
		path = append(path, at)
		st, ok := blocker(at, waits)
		if !ok {
			if len(steps) == 0 {
				return fmt.Sprintf("%s waits for %q, which nothing that waits could free", me.name(), mine[0].key.name), nil, nil
			}
			return text("", steps), nil, nil
		}
		steps = append(steps, st)
		if i, ok := seen[st.next]; ok {
			steps, path = steps[i:], path[i:]
			lead := ""
			if st.next != me {
				lead = "the wait queues behind a cycle: "
			}
			return text(lead, steps), path, steps
		}
		at, waits = st.next, st.next.waits
	}
}

// hop is one step of a wait-for path: from's attempt w waits for key,
// held by (or queued behind) next.
type hop struct {
	from, next *simSession
	w          *simAttempt
	key        *simKey
	queued     bool
}

// text writes the steps out, no longer than a result may carry: a chain
// of a thousand sessions is named by its first steps.
func text(lead string, steps []hop) string {
	var b strings.Builder
	b.WriteString(lead)
	for i, st := range steps {
		if b.Len() > MaxErrLen {
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		how := "held by"
		if st.queued {
			how = "queued behind"
		}
		if st.next == st.from {
			how += " itself,"
		}
		fmt.Fprintf(&b, "%s waits for %q, %s %s", st.from.name(), st.key.name, how, st.next.name())
	}
	return b.String()
}

// blocker is the first stuck session that the first of ss's waits with
// one waits for: a holder of its key, or a waiter ahead of it.
func blocker(ss *simSession, waits []*simAttempt) (hop, bool) {
	for _, w := range waits {
		if w.held {
			continue
		}
		for _, h := range w.key.holders {
			if !h.released {
				return hop{from: ss, next: h.sess, w: w, key: w.key}, true
			}
		}
		for _, a := range w.key.queue {
			if a == w {
				break
			}
			return hop{from: ss, next: a.sess, w: w, key: w.key, queued: true}, true
		}
	}
	return hop{}, false
}

// name is how a refusal names the session: by its Session's ID (the
// label node.Session.ID returns) when it has one, and its peer.
func (ss *simSession) name() string {
	if ss.label != 0 {
		return fmt.Sprintf("session %d (%s)", ss.label, ss.owner)
	}
	return fmt.Sprintf("shard session %d (%s)", ss.id, ss.owner)
}
