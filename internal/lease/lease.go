// Package lease is the leader side of lockmesh's session leases: the table
// of when each session was last heard from on every shard this peer leads,
// and the rules of docs/SAFETY.md that decide which keepalives are
// acknowledged and which sessions are expired.
//
// Keepalives are not written to the Raft log: the leader of a shard keeps,
// in memory, when it last heard from each session (the etcd and Chubby
// model) and proposes ExpireSession once a session has been silent for a
// full TTL. Four rules keep that safe across leader changes:
//
//  0. A leader first commits a LeaderTerm entry with its Raft term, and
//     acknowledges no keepalive and expires no session before its own
//     replica has applied it. An ExpireSession carries the term of the
//     leader that decided it, and the state machine applies it only if
//     that is the term it has recorded: an expiry decided by a leader
//     whose term has ended (it was paused, its disk stalled, its view of
//     leadership lagged) never takes effect, even when its proposal is
//     forwarded to and committed by its successor.
//  1. A leader acknowledges a keepalive only after a ReadIndex round has
//     confirmed, after the keepalive arrived, that it is still the leader,
//     and after its replica has applied everything up to that index. So an
//     acknowledged keepalive was received before any later leader was
//     elected, and any ExpireSession an old leader left in the log has
//     already been applied (the session then reads as expired).
//  2. A new leader starts every session's timer at its election plus a
//     grace of two election timeouts, so a holder whose last keepalive went
//     to the old leader keeps its full TTL.
//  3. Once a leader decides to expire a session it never acknowledges that
//     session again, even if the ExpireSession proposal is slow to commit.
//
// The holder counts its lease from the time it sent the keepalive, minus a
// margin, on its own clock, which counts time the machine spends
// suspended (internal/clock's Boot); the leader counts from when it received
// it, on Go's monotonic clock. So the holder always gives up first, as long as clock rates
// differ by less than the margin over one TTL.
//
// A Table makes the decisions and holds the state they need; it does no
// I/O and reads no clock. The caller (internal/leader) runs the Raft side:
// it reports leader changes, confirms leadership with ReadIndex (rule 1),
// reads the shard's sessions and recorded term, proposes LeaderTerm and
// ExpireSession, and passes in the times it read from its own clock, so
// every rule can be tested with made-up times.
package lease

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// Options configure a Table.
type Options struct {
	// ElectionTimeout is the shards' Raft election timeout. A new leader
	// counts every session's TTL from its election plus Grace, two
	// election timeouts (rule 2): about the longest a deposed leader that
	// does not know it yet can go on (CheckQuorum), twice.
	ElectionTimeout time.Duration
	// UnsafeExpireAfter, when > 0, expires a session after this long
	// without keepalives instead of its TTL, and drops the grace: a
	// deliberately broken variant that the safety checkers must catch.
	// Tests only.
	UnsafeExpireAfter time.Duration
}

// State is what a shard's replicated state machine reports to the lease
// logic: the leader term it has recorded (LeaderTerm) and its live
// sessions, each with its own TTL.
type State struct {
	Term     uint64
	Sessions []lockfsm.SessionInfo
	// Holds are the held locks that have a maximum hold time.
	Holds []lockfsm.HoldInfo
}

// Expiry is what Lapsed decided for one shard.
type Expiry struct {
	// Term is the leader term the decision was made in. Every
	// ExpireSession of Sessions must carry it (rule 0), so that the state
	// machine refuses it once that term has ended.
	Term uint64
	// RecordTerm asks the caller to propose LeaderTerm(Term) (rule 0) and
	// to call RecordingDone when that attempt ends, committed or not.
	// Lapsed asks for no second proposal of the term meanwhile.
	RecordTerm bool
	// Sessions lapsed: they are now expiring, and the caller proposes
	// ExpireSession for each. The table never acknowledges them again in
	// Term (rule 3).
	Sessions []lockfsm.SessionInfo
	// Holds have been held for their maximum: the caller proposes
	// ExpireHold for each, stamped with Term. A hold's time counts from
	// when this leader first saw it in its replica's state, which is
	// after it was granted, so never before the holder's own count,
	// which starts before it asked (the hold rule of docs/SAFETY.md).
	Holds []lockfsm.HoldInfo
}

// Table is the leader-side lease table of one peer, for every shard it
// leads. The zero value is not usable; use New. Its methods are safe for
// concurrent use.
type Table struct {
	grace       time.Duration
	expireAfter time.Duration // UnsafeExpireAfter

	mu     sync.Mutex
	shards map[uint64]*shardLeases
}

// shardLeases is the lease state of one shard this peer leads.
type shardLeases struct {
	term     uint64
	since    time.Time            // when this peer became leader in term
	lastSeen map[uint64]time.Time // session -> last keepalive received (or since+grace)
	expiring map[uint64]bool      // sessions being expired: never acknowledged again
	// recording is set while a LeaderTerm proposal for term is in flight.
	recording bool
	// holdSeen is when this leader first saw each timed hold; holdEnding
	// those it asked to end.
	holdSeen   map[hold]time.Time
	holdEnding map[hold]bool
}

// hold names a held attempt.
type hold struct{ session, req uint64 }

func newShardLeases(term uint64, now time.Time) *shardLeases {
	return &shardLeases{term: term, since: now, lastSeen: map[uint64]time.Time{}, expiring: map[uint64]bool{},
		holdSeen: map[hold]time.Time{}, holdEnding: map[hold]bool{}}
}

// New returns an empty table.
func New(o Options) *Table {
	t := &Table{grace: 2 * o.ElectionTimeout, expireAfter: o.UnsafeExpireAfter, shards: map[uint64]*shardLeases{}}
	if t.expireAfter > 0 {
		t.grace = 0
	}
	return t
}

// Grace is how long past its election a new leader waits before it starts
// counting a session's TTL (rule 2): two election timeouts, or zero with
// UnsafeExpireAfter.
func (t *Table) Grace() time.Duration { return t.grace }

// LeaderChanged records a leader change of shard as Raft reports it:
// replica is this peer's replica of the shard, leader the replica now
// leading it (0 when none is known), term the Raft term, now the time it
// was reported. When replica leads, every session's timer starts afresh at
// now + Grace (rule 2) unless it already led in term; otherwise the
// shard's lease state is dropped. It reports whether this peer just became
// the leader: the caller should then get its term recorded (Lapsed) at
// once.
func (t *Table) LeaderChanged(shard, replica, leader, term uint64, now time.Time) (elected bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if leader == 0 || leader != replica {
		delete(t.shards, shard)
		return false
	}
	if s := t.shards[shard]; s != nil && s.term == term {
		return false
	}
	t.shards[shard] = newShardLeases(term, now)
	return true
}

// Drop forgets a shard whose local replica stopped.
func (t *Table) Drop(shard uint64) {
	t.mu.Lock()
	delete(t.shards, shard)
	t.mu.Unlock()
}

// IsLeader reports whether this peer leads shard by the table's view.
func (t *Table) IsLeader(shard uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.shards[shard] != nil
}

// LeaderSince returns when this peer became the leader of shard in its
// current term, and false if it does not lead the shard.
func (t *Table) LeaderSince(shard uint64) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.shards[shard]
	if s == nil {
		return time.Time{}, false
	}
	return s.since, true
}

// Led returns the shards this peer leads, sorted.
func (t *Table) Led() []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]uint64, 0, len(t.shards))
	for id := range t.shards {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Ack decides which of sessions, named by a keepalive that reached this
// peer at received, are acknowledged (acked) and which are reported lost.
// The caller must have confirmed, by a ReadIndex round begun after
// received, that this peer leads shard in term, and read st from its
// replica after applying up to that read index (rule 1).
//
// Nothing is acknowledged, and ErrTermNotRecorded returned, until st has
// recorded term (rule 0), and ErrNotLeader unless the table has this peer
// leading shard in term (see ErrNotLeader). A session is lost when st
// does not list it or when this leader decided to expire it (rule 3). An
// acknowledged session's timer restarts at received unless it is already
// later (a newer keepalive, or the grace of rule 2).
func (t *Table) Ack(shard, term uint64, st State, sessions []uint64, received time.Time) (acked, lost []uint64, err error) {
	live := make(map[uint64]bool, len(st.Sessions))
	for _, s := range st.Sessions {
		live[s.ID] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// Only Lapsed, on a table leading shard in term, asks for
	// LeaderTerm(term); so without that state nothing could be acked
	// anyway (rule 0), and a confirmation that arrives after Raft reported
	// the leadership lost must not bring the state back: it would make
	// this peer act as the leader (IsLeader, Lapsed) until the next event.
	s := t.shards[shard]
	switch {
	case s == nil || s.term != term || st.Term > term:
		return nil, nil, ErrNotLeader
	case st.Term < term:
		return nil, nil, ErrTermNotRecorded
	}
	for _, id := range sessions {
		if !live[id] || s.expiring[id] {
			lost = append(lost, id)
			continue
		}
		acked = append(acked, id)
		seen, ok := s.lastSeen[id]
		if !ok {
			seen = s.since.Add(t.grace) // rule 2, before Lapsed saw the session
		}
		s.lastSeen[id] = later(seen, received)
	}
	return acked, lost, nil
}

// Lapsed decides, for a shard this peer leads, at now, from st read from
// its local replica: whether its term must be recorded first (rule 0), and
// else which sessions have been silent for more than their TTL (rule 2) and
// are to be expired (rule 3). A session the table has not seen in this
// term starts its timer at the later of now and election + Grace. Sessions
// st no longer lists are forgotten. It decides nothing when this peer does
// not lead shard, or when st has recorded a later term than this leader's
// (its view of leadership is stale).
func (t *Table) Lapsed(shard uint64, st State, now time.Time) Expiry {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.shards[shard]
	if s == nil {
		return Expiry{}
	}
	d := Expiry{Term: s.term}
	if st.Term != s.term {
		if st.Term < s.term && !s.recording {
			s.recording = true
			d.RecordTerm = true
		}
		return d
	}
	live := make(map[uint64]bool, len(st.Sessions))
	for _, info := range st.Sessions {
		live[info.ID] = true
		seen, ok := s.lastSeen[info.ID]
		if !ok {
			// First sight in this term (rule 2), or a session opened since.
			seen = later(now, s.since.Add(t.grace))
			s.lastSeen[info.ID] = seen
		}
		if !s.expiring[info.ID] && now.Sub(seen) > t.ttl(info) {
			s.expiring[info.ID] = true // rule 3
			d.Sessions = append(d.Sessions, info)
		}
	}
	for id := range s.lastSeen {
		if !live[id] {
			delete(s.lastSeen, id)
			delete(s.expiring, id)
		}
	}
	d.Holds = s.endedHolds(st.Holds, now)
	return d
}

// endedHolds returns the holds of held that have been held for their
// maximum since this leader first saw them, and forgets those held no
// longer lists.
func (s *shardLeases) endedHolds(held []lockfsm.HoldInfo, now time.Time) []lockfsm.HoldInfo {
	var ended []lockfsm.HoldInfo
	live := make(map[hold]bool, len(held))
	for _, h := range held {
		k := hold{h.Session, h.Req}
		live[k] = true
		seen, ok := s.holdSeen[k]
		if !ok {
			seen = now
			s.holdSeen[k] = seen
		}
		if !s.holdEnding[k] && now.Sub(seen) >= Millis(h.MaxHoldMillis) {
			s.holdEnding[k] = true
			ended = append(ended, h)
		}
	}
	for k := range s.holdSeen {
		if !live[k] {
			delete(s.holdSeen, k)
			delete(s.holdEnding, k)
		}
	}
	return ended
}

// Millis is ms milliseconds (a TTLMillis or MaxHoldMillis of the
// replicated state), or the longest Duration when that is longer.
func Millis(ms uint64) time.Duration {
	if ms > math.MaxInt64/uint64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// RecordingDone tells the table that the LeaderTerm proposal for term that
// Lapsed asked for has ended, committed or not. Lapsed asks again while
// the shard's state has not recorded the term.
func (t *Table) RecordingDone(shard, term uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.shards[shard]; s != nil && s.term == term {
		s.recording = false
	}
}

// ttl is how long session info may go without keepalives: its own TTL, as
// the state machine recorded it when the session opened.
func (t *Table) ttl(info lockfsm.SessionInfo) time.Duration {
	if t.expireAfter > 0 {
		return t.expireAfter
	}
	return Millis(info.TTLMillis) // longer than a Duration: never lapses
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
