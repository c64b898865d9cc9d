package lockfsm

import (
	"cmp"
	"fmt"
	"slices"
)

// Cross-shard deadlocks. The check FlagDeadlock asks for sees one shard:
// a Session waiting on one shard for a key held by a Session that waits on
// another shard for a key of the first is a cycle no shard sees whole.
// Every peer that has a Session waiting reads WaitGraph from each shard
// and plays them together with StuckWaits, under the same rules as the
// check, with a Session (a session label) one thread of control across
// all its shards.

// WaitAttempt is a holder or waiter of a key in a WaitGraph: the
// attempt's Holder record (Token 0 for a waiter), its group and whether
// it waits with FlagDeadlock.
type WaitAttempt struct {
	Holder
	// Group is the size of the attempt's all-or-nothing group (0 for
	// none) and First the request id the group starts at.
	Group   uint16
	First   uint64
	Flagged bool
}

// WaitKey is a key somebody waits for, with its role (as KeyInfo.Role),
// limit, holders in grant order and waiters in FIFO order.
type WaitKey struct {
	Key              string
	Role             Kind
	Limit            uint32
	Holders, Waiters []WaitAttempt
}

// WaitGraph returns every key of the shard that has a waiter, sorted by
// key, with its holders and waiters: all a deadlock play needs of the
// shard, since a key nobody waits for holds nobody up. complete is false,
// and the keys cut short, when they would hold more than max attempts. It
// costs one pass over the sessions that wait and their attempts.
func (s *State) WaitGraph(max int) (keys []WaitKey, complete bool) {
	names := map[string]bool{}
	for _, sess := range s.sessions {
		if sess.waiting == 0 {
			continue
		}
		for _, at := range sess.reqs {
			if at.state == ReqWaiting {
				names[at.key] = true
			}
		}
	}
	sorted := make([]string, 0, len(names))
	for name := range names {
		sorted = append(sorted, name)
	}
	slices.Sort(sorted)
	n := 0
	for _, name := range sorted {
		k := s.keys[name]
		if n += len(k.holders()) + len(k.waiters()); n > max {
			return keys, false
		}
		keys = append(keys, WaitKey{Key: name, Role: k.role().kindName(), Limit: k.limit(),
			Holders: s.waitAttempts(k.holders()), Waiters: s.waitAttempts(k.waiters())})
	}
	return keys, true
}

func (s *State) waitAttempts(list []ref) []WaitAttempt {
	out := make([]WaitAttempt, len(list))
	for i, h := range s.holders(list, 0) {
		at := s.attemptOf(list[i])
		out[i] = WaitAttempt{Holder: h, Group: at.size, First: at.first(list[i].req), Flagged: at.deadlock}
	}
	return out
}

// CycleStep is one step of a wait-for cycle: the attempt (Session, Req)
// of shard waits for Key, held by, or queued behind, the next step's
// session.
type CycleStep struct {
	Shard, Session, Req uint64
	Key                 string
}

// ShardWaits is one shard's WaitGraph.
type ShardWaits struct {
	Shard uint64
	Keys  []WaitKey
}

// StuckWait is a waiting attempt that could never be granted while every
// Session that waits with FlagDeadlock keeps what it holds.
type StuckWait struct {
	Shard  uint64
	Waiter WaitAttempt
	Key    string
	Why    string   // the wait-for cycle, as a refusal names it
	Cycle  []uint64 // the labels of the cycle's sessions, in its order
	// Steps are the cycle's steps, in its order: a checker that reads the
	// graphs again can see whether they stayed as they were.
	Steps   []CycleStep
	Victim  bool // this wait is the one of its cycle to refuse
	cycleOf []*simSession
}

// StuckWaits plays the shards' wait graphs forward together, each Session
// label one thread of control across all its shards (a session with no
// label is one of its own), and returns the flagged waits that would
// never be granted, in shard, key and queue order. Of each cycle one wait
// is the Victim, the same whoever computes it from the same graphs: the
// first wait, in that order, of the cycle's Session with the highest
// label among those that hold a key. Refusing it breaks the cycle.
func StuckWaits(shards []ShardWaits) []StuckWait { return stuckWaits(shards, brokenRules{}) }

// stuckWaits is StuckWaits, with broken rules when a test asks.
func stuckWaits(shards []ShardWaits, broken brokenRules) []StuckWait {
	p := &deadlockPlay{sessions: map[uint64]*simSession{}, keys: map[string]*simKey{}, broken: broken}
	var flagged []*simAttempt
	var shardOf []uint64
	unlabelled := uint64(0)
	labels := map[attemptID]uint64{} // shard sessions with no label, by their own id
	sess := func(shard uint64, h Holder) *simSession {
		id := h.Label
		if id == 0 || p.broken.crossShardBySession {
			k := attemptID{shard: shard, session: h.Session}
			if labels[k] == 0 {
				unlabelled++
				labels[k] = 1<<63 | unlabelled
			}
			id = labels[k]
		}
		ss := p.sessions[id]
		if ss == nil {
			ss = &simSession{id: id, owner: h.Owner, label: h.Label}
			p.sessions[id] = ss
		}
		return ss
	}
	shards = slices.Clone(shards)
	slices.SortFunc(shards, func(a, b ShardWaits) int { return cmp.Compare(a.Shard, b.Shard) })
	for _, sw := range shards {
		for _, wk := range sw.Keys {
			name := fmt.Sprintf("%d/%s", sw.Shard, wk.Key)
			k := &simKey{shard: sw.Shard, name: wk.Key, role: roleOf(wk.Role), limit: wk.Limit}
			p.keys[name] = k
			p.order = append(p.order, name)
			for j, list := range [][]WaitAttempt{wk.Holders, wk.Waiters} {
				for _, wa := range list {
					ss := sess(sw.Shard, wa.Holder)
					sa := &simAttempt{sess: ss, id: attemptID{sw.Shard, wa.Session, wa.Req}, req: wa.Req, key: k,
						kind: wa.Kind, permits: max(wa.Permits, 1), size: wa.Group, first: wa.First, flagged: wa.Flagged}
					if j == 0 {
						k.hold(sa)
						ss.holds = append(ss.holds, sa)
						continue
					}
					k.queue = append(k.queue, sa)
					ss.waitsFor(sa)
					if sa.flagged {
						ss.blocked++
						flagged = append(flagged, sa)
						shardOf = append(shardOf, sw.Shard)
					}
				}
			}
		}
	}
	p.play()
	var stuck []StuckWait
	for i, w := range flagged {
		if w.held {
			continue
		}
		// A group waits whole: its explanation starts from whichever of
		// its attempts is held up.
		mine := []*simAttempt{w}
		for j := range uint64(min(w.size, MaxGroup)) {
			if m := w.sess.group[attemptID{w.id.shard, w.id.session, w.first + j}]; m != nil && m != w {
				mine = append(mine, m)
			}
		}
		why, cycle, steps := p.explain(w.sess, mine)
		st := StuckWait{Shard: shardOf[i], Key: w.key.name, Why: why, cycleOf: cycle}
		for _, h := range steps {
			st.Steps = append(st.Steps, CycleStep{Shard: h.key.shard, Session: h.w.id.session, Req: h.w.req, Key: h.key.name})
		}
		st.Waiter = WaitAttempt{Holder: Holder{Session: w.id.session, Req: w.req, Owner: w.sess.owner, Label: w.sess.label, Kind: w.kind, Permits: w.permits},
			Group: w.size, First: w.first, Flagged: true}
		for _, ss := range cycle {
			st.Cycle = append(st.Cycle, ss.label)
		}
		stuck = append(stuck, st)
	}
	// The victim of a cycle: of the stuck waits that lead into it, the
	// first of the cycle's Session with the highest label among those
	// that hold a key (a peer checks only the waits of Sessions that hold
	// one: a cycle may run through a session that holds nothing, queued
	// behind a group), or among all, when none does.
	chosen := map[string]bool{}
	for i := range stuck {
		cyc := stuck[i].cycleOf
		if len(cyc) == 0 || stuck[i].Waiter.Label == 0 {
			continue
		}
		var top *simSession
		for _, holding := range []bool{true, false} {
			for _, ss := range cyc {
				if ss.label != 0 && (len(ss.holds) > 0 || !holding) && (top == nil || ss.label > top.label) {
					top = ss
				}
			}
			if top != nil {
				break
			}
		}
		if top == nil {
			continue
		}
		ids := make([]uint64, len(cyc))
		for j, ss := range cyc {
			ids[j] = ss.id
		}
		slices.Sort(ids)
		key := fmt.Sprint(ids)
		if top.label == stuck[i].Waiter.Label && !chosen[key] {
			chosen[key] = true
			stuck[i].Victim = true
		}
	}
	for i := range stuck {
		stuck[i].cycleOf = nil
	}
	return stuck
}
