package node

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// The apply log and the lease-overlap checker.
//
// peer.Hooks.OnApply on every peer reports each lock shard entry each replica
// applies, with the grants it made. From that the apply log keeps, per
// shard and index, the grants and the time the entry was first applied on
// any replica, and checks online that
//
//   - every replica that applies an index makes the same grants there, and
//   - along each replica's apply stream, tokens strictly increase per key.
//
// The lease-overlap checker then compares the commit-ordered grants of each
// key with what the holders saw: a holder that found its Done() open after
// the next grant of its key (the next higher token) had been applied
// anywhere held a lock the cluster had already given to someone else. That
// is the double grant users see, whether or not the two holders happened to
// touch the resource at the same moment.

// applyLog records every replica's apply stream. Times are on the test's
// real monotonic clock.
type applyLog struct {
	mu         sync.Mutex
	streams    map[streamID]*applyStream
	entries    map[entryID]*appliedEntry
	restarts   int // apply streams that went back to a lower index
	violations []string
}

// streamID names one replica's apply stream: a peer's start (incarnation)
// and a shard.
type streamID struct {
	peer        string
	incarnation int
	shard       uint64
}

type applyStream struct {
	last      uint64            // index applied last
	lastToken map[string]uint64 // per key, the token granted last
}

type entryID struct{ shard, index uint64 }

type appliedEntry struct {
	grants []lockfsm.Grant
	print  string    // what the grants look like, for comparing replicas
	first  time.Time // when the first replica applied it
	by     string    // which peer that was
}

func newApplyLog() *applyLog {
	return &applyLog{streams: map[streamID]*applyStream{}, entries: map[entryID]*appliedEntry{}}
}

// hook is the peer.Hooks.OnApply of one start of peer: it runs on dragonboat's
// apply goroutine and only takes a mutex.
func (a *applyLog) hook(peer string, incarnation int) func(shard, index uint64, grants []lockfsm.Grant) {
	return func(shard, index uint64, grants []lockfsm.Grant) {
		a.applied(streamID{peer, incarnation, shard}, index, grants, time.Now())
	}
}

func grantsPrint(grants []lockfsm.Grant) string {
	var b strings.Builder
	for _, g := range grants {
		b.WriteString(g.Key)
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(g.Token, 10))
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(g.Session, 10))
		b.WriteByte(' ')
		b.WriteString(strconv.FormatUint(g.Req, 10))
		b.WriteByte(';')
	}
	return b.String()
}

func (a *applyLog) applied(id streamID, index uint64, grants []lockfsm.Grant, at time.Time) {
	print := grantsPrint(grants)
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.streams[id]
	if s == nil || index <= s.last {
		// A new stream, or a replica of this shard started again on the
		// same peer (removed and added back) that replays the log from an
		// earlier point: a stream of its own.
		if s != nil {
			a.restarts++
		}
		s = &applyStream{lastToken: map[string]uint64{}}
		a.streams[id] = s
	}
	s.last = index
	for _, g := range grants {
		if last := s.lastToken[g.Key]; g.Token <= last {
			a.violations = append(a.violations, fmt.Sprintf("apply stream of %s (start %d) shard %d: key %s granted token %d at index %d after token %d",
				id.peer, id.incarnation, id.shard, g.Key, g.Token, index, last))
		}
		s.lastToken[g.Key] = g.Token
	}
	e := a.entries[entryID{id.shard, index}]
	if e == nil {
		a.entries[entryID{id.shard, index}] = &appliedEntry{grants: append([]lockfsm.Grant(nil), grants...), print: print, first: at, by: id.peer}
		return
	}
	if e.print != print {
		a.violations = append(a.violations, fmt.Sprintf("shard %d index %d: %s applied grants [%s], %s applied [%s]",
			id.shard, index, e.by, e.print, id.peer, print))
	}
}

// keyGrant is one grant of a key in commit order.
type keyGrant struct {
	lockfsm.Grant
	shard, index uint64
	first        time.Time
	by           string
}

// grantsByKey lists every key's grants in commit order.
func (a *applyLog) grantsByKey() map[string][]keyGrant {
	a.mu.Lock()
	ids := make([]entryID, 0, len(a.entries))
	for id, e := range a.entries {
		if len(e.grants) > 0 {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].shard != ids[j].shard {
			return ids[i].shard < ids[j].shard
		}
		return ids[i].index < ids[j].index
	})
	out := map[string][]keyGrant{}
	for _, id := range ids {
		e := a.entries[id]
		for _, g := range e.grants {
			out[g.Key] = append(out[g.Key], keyGrant{Grant: g, shard: id.shard, index: id.index, first: e.first, by: e.by})
		}
	}
	a.mu.Unlock()
	return out
}

// leaseKey names one lock: its key and token.
type leaseKey struct {
	key   string
	token uint64
}

// leaseSight is the last time a lock's Done() was seen open, and by whom:
// the time is taken before the check, so the lease was open at or after it.
type leaseSight struct {
	at  int64 // history time
	who string
}

// leaseSights records, per lock, the last time its holder found Done()
// open.
type leaseSights struct {
	mu   sync.Mutex
	last map[leaseKey]leaseSight
}

func newLeaseSights() *leaseSights { return &leaseSights{last: map[leaseKey]leaseSight{}} }

func (s *leaseSights) saw(key string, token uint64, who string, at int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := leaseKey{key, token}
	if at > s.last[k].at {
		s.last[k] = leaseSight{at, who}
	}
}

// check runs the apply log's checkers against the holders' sightings of
// their own leases, for mutexes; base is the history's time zero.
func (a *applyLog) check(base time.Time, sights *leaseSights) []string {
	return a.checkWith(base, sights, nil)
}

// together judges, for the lease-overlap checker, whether the earlier
// grants held (their holders saw their leases open after next was first
// applied) may be held together with next: ok, or why not (may be "").
// nil is the mutex's rule: nothing may.
type together func(key string, held []keyGrant, next keyGrant) (ok bool, why string)

// checkWith is check with the lock's rule of which grants may be held
// together (the lock family's read/write locks and semaphores).
func (a *applyLog) checkWith(base time.Time, sights *leaseSights, may together) []string {
	a.mu.Lock()
	out := append([]string(nil), a.violations...)
	a.mu.Unlock()
	byKey := a.grantsByKey()
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	pos := map[leaseKey]int{}
	for _, key := range keys {
		gs := byKey[key]
		for i, g := range gs {
			if i > 0 {
				prev := gs[i-1]
				if g.shard != prev.shard {
					out = append(out, fmt.Sprintf("key %s granted on shard %d and on shard %d", key, prev.shard, g.shard))
				} else if g.Token <= prev.Token {
					out = append(out, fmt.Sprintf("key %s: token %d granted at shard %d index %d after token %d at index %d",
						key, g.Token, g.shard, g.index, prev.Token, prev.index))
				}
			}
			pos[leaseKey{key, g.Token}] = i
		}
	}
	sights.mu.Lock()
	defer sights.mu.Unlock()
	locks := make([]leaseKey, 0, len(sights.last))
	for k := range sights.last {
		locks = append(locks, k)
	}
	sort.Slice(locks, func(i, j int) bool {
		if locks[i].key != locks[j].key {
			return locks[i].key < locks[j].key
		}
		return locks[i].token < locks[j].token
	})
	at := func(t time.Time) float64 { return t.Sub(base).Seconds() }
	// heldAt[key][j] lists the earlier grants of key whose holders saw
	// their leases open after grant j was first applied. First-applied
	// times rise along the commit order (every replica applies in order),
	// so those are the grants after i up to the last applied before the
	// sighting.
	heldAt := map[string]map[int][]leaseKey{}
	for _, lk := range locks {
		s := sights.last[lk]
		i, ok := pos[lk]
		if !ok {
			out = append(out, fmt.Sprintf("key %s: %s held token %d, which no replica applied a grant of", lk.key, s.who, lk.token))
			continue
		}
		gs, seen := byKey[lk.key], base.Add(time.Duration(s.at))
		for j := i + 1; j < len(gs) && gs[j].first.Before(seen); j++ {
			if heldAt[lk.key] == nil {
				heldAt[lk.key] = map[int][]leaseKey{}
			}
			heldAt[lk.key][j] = append(heldAt[lk.key][j], lk)
		}
	}
	reported := map[leaseKey]bool{}
	for _, key := range keys {
		gs := byKey[key]
		for _, j := range slices.Sorted(maps.Keys(heldAt[key])) {
			lks, next := heldAt[key][j], gs[j]
			held := make([]keyGrant, len(lks))
			for n, lk := range lks {
				held[n] = gs[pos[lk]]
			}
			ok, why := false, ""
			if may != nil {
				ok, why = may(key, held, next)
			}
			if ok {
				continue
			}
			if why != "" {
				why = " (" + why + ")"
			}
			for _, lk := range lks {
				if reported[lk] {
					continue
				}
				reported[lk] = true
				s, seen := sights.last[lk], base.Add(time.Duration(sights.last[lk].at))
				out = append(out, fmt.Sprintf("key %s: lease overlap: %s saw its lease (token %d) open at %.3fs, %v after token %d (session %d of %s) was granted at shard %d index %d, first applied on %s at %.3fs%s",
					lk.key, s.who, lk.token, time.Duration(s.at).Seconds(), seen.Sub(next.first).Round(time.Millisecond), next.Token, next.Session, next.Owner, next.shard, next.index, next.by, at(next.first), why))
			}
		}
	}
	return out
}

// describe sums up the apply log for test logs.
func (a *applyLog) describe() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	grants := 0
	for _, e := range a.entries {
		grants += len(e.grants)
	}
	return fmt.Sprintf("%d entries with %d grants applied on %d replica streams (%d restarted lower)", len(a.entries), grants, len(a.streams), a.restarts)
}

// The checker must be able to fail: hand-fed apply streams and sightings.
func TestApplyLogAndOverlapChecker(t *testing.T) {
	base := time.Now()
	ms := func(d int) time.Time { return base.Add(time.Duration(d) * time.Millisecond) }
	g := func(key string, token, session uint64) lockfsm.Grant {
		return lockfsm.Grant{Key: key, Token: token, Session: session, Req: 1, Owner: "p"}
	}
	type apply struct {
		peer   string
		index  uint64
		grants []lockfsm.Grant
		at     int
	}
	type sight struct {
		token uint64
		at    int
	}
	cases := []struct {
		name    string
		applies []apply
		sights  []sight
		want    string // "" for a legal run, else a word of the violation
	}{
		{"hand-off after the lease was seen closed",
			[]apply{{"a", 1, []lockfsm.Grant{g("k", 1, 1)}, 0}, {"b", 1, []lockfsm.Grant{g("k", 1, 1)}, 1}, {"a", 2, []lockfsm.Grant{g("k", 2, 2)}, 50}},
			[]sight{{1, 40}, {2, 60}}, ""},
		{"holder saw its lease open after the next grant was applied",
			[]apply{{"a", 1, []lockfsm.Grant{g("k", 1, 1)}, 0}, {"b", 2, []lockfsm.Grant{g("k", 2, 2)}, 50}, {"a", 2, []lockfsm.Grant{g("k", 2, 2)}, 70}},
			[]sight{{1, 60}}, "lease overlap"},
		{"replicas disagree on an index",
			[]apply{{"a", 1, []lockfsm.Grant{g("k", 1, 1)}, 0}, {"b", 1, []lockfsm.Grant{g("k", 1, 2)}, 1}},
			nil, "applied grants"},
		{"token went down along one replica's stream",
			[]apply{{"a", 1, []lockfsm.Grant{g("k", 5, 1)}, 0}, {"a", 2, []lockfsm.Grant{g("k", 4, 2)}, 1}},
			nil, "after token 5"},
		{"a holder's token was never applied",
			[]apply{{"a", 1, []lockfsm.Grant{g("k", 1, 1)}, 0}},
			[]sight{{9, 5}}, "no replica applied"},
	}
	for _, c := range cases {
		a := newApplyLog()
		for _, ap := range c.applies {
			a.applied(streamID{ap.peer, 1, 1}, ap.index, ap.grants, ms(ap.at))
		}
		s := newLeaseSights()
		for _, st := range c.sights {
			s.saw("k", st.token, "w", int64(time.Duration(st.at)*time.Millisecond))
		}
		v := a.check(base, s)
		switch {
		case c.want == "" && len(v) > 0:
			t.Errorf("%s: legal run flagged: %v", c.name, v)
		case c.want != "" && (len(v) == 0 || !strings.Contains(strings.Join(v, "\n"), c.want)):
			t.Errorf("%s: want a violation mentioning %q, got %v", c.name, c.want, v)
		}
	}
}
