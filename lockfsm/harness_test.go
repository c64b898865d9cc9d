package lockfsm

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
)

// checker applies entries and checks, after each, the invariants of Verify
// plus what only history shows: tokens strictly increase per key in grant
// order, across entries, and each holder's and waiter's value is the one
// its Acquire gave or its last accepted SetValue set.
type checker struct {
	s         *State
	index     uint64
	lastToken map[string]uint64
	values    map[ref][]byte // by attempt, as its commands set them
	set       map[ref]bool   // attempts whose Acquire was answered
	lastReq   map[ref]uint64 // the highest request id of a SetValue or Acquire of each attempt
	// mirror is every key's holders and waiters as a watcher rebuilds
	// them from the entries' events alone; after each entry it must be
	// the state's.
	mirror map[string]*mirrorKey
}

// mirrorKey is a key as its events describe it.
type mirrorKey struct{ holders, waiters []Holder }

func newChecker() *checker { return newCheckerWith(brokenRules{}) }

// newCheckerWith is newChecker on a State with broken rules.
func newCheckerWith(broken brokenRules) *checker {
	s := New()
	s.broken = broken
	return &checker{s: s, lastToken: map[string]uint64{}, values: map[ref][]byte{}, set: map[ref]bool{}, lastReq: map[ref]uint64{}, mirror: map[string]*mirrorKey{}}
}

func (c *checker) apply(cmds ...Command) ([]Result, []Grant, error) {
	rs, gs, _, err := c.applyEvents(cmds...)
	return rs, gs, err
}

// applyEvents is apply, returning the entry's events too.
func (c *checker) applyEvents(cmds ...Command) ([]Result, []Grant, []Event, error) {
	c.index++
	rs, gs, es := c.s.ApplyEvents(c.index, cmds)
	err := c.checkEntry(cmds, rs, gs)
	if err == nil {
		if err = c.checkEvents(es); err != nil {
			err = fmt.Errorf("entry %d: %v", c.index, err)
		}
	}
	return rs, gs, es, err
}

// checkEntry checks what applying cmds at c.index left and answered.
func (c *checker) checkEntry(cmds []Command, rs []Result, gs []Grant) error {
	if len(rs) != len(cmds) {
		return fmt.Errorf("entry %d: %d results for %d commands", c.index, len(rs), len(cmds))
	}
	if err := c.s.Verify(); err != nil {
		return fmt.Errorf("entry %d: %v", c.index, err)
	}
	// A replica returns the results encoded: one that cannot be would
	// fail the entry on every replica, and again on every restart.
	if _, err := EncodeResults(rs); err != nil {
		return fmt.Errorf("entry %d: %v", c.index, err)
	}
	var prev uint64
	for _, g := range gs {
		if g.Token <= prev {
			return fmt.Errorf("entry %d: grant tokens not ascending: %d after %d", c.index, g.Token, prev)
		}
		prev = g.Token
		if g.Token <= c.lastToken[g.Key] {
			return fmt.Errorf("entry %d: key %q token %d not above its previous %d", c.index, g.Key, g.Token, c.lastToken[g.Key])
		}
		c.lastToken[g.Key] = g.Token
	}
	if err := c.checkValues(cmds, rs); err != nil {
		return fmt.Errorf("entry %d: %v", c.index, err)
	}
	for i, r := range rs {
		if r.Status < StatusOK || r.Status > StatusSessionLimit {
			return fmt.Errorf("entry %d: command %d: bad status %d", c.index, i, r.Status)
		}
		explained := r.Status == StatusInvalid || r.Status == StatusStaleTerm || r.Status == StatusMismatch || r.Status == StatusDeadlock || r.Status == StatusLimitMismatch || r.Status == StatusSessionLimit
		if explained != (r.Err != "") {
			return fmt.Errorf("entry %d: command %d: status %v with err %q", c.index, i, r.Status, r.Err)
		}
	}
	return nil
}

// checkValues follows the values the entry's commands set, and checks
// those of every holder and waiter against them.
func (c *checker) checkValues(cmds []Command, rs []Result) error {
	for i, cmd := range cmds {
		switch r := (ref{cmd.Session, cmd.Req}); {
		case cmd.Op == OpAcquire && !c.set[r] && (rs[i].Status == StatusGranted || rs[i].Status == StatusQueued):
			c.set[r] = true // a repeat keeps the first one's value
			c.values[r] = cmd.Value
			c.lastReq[r] = cmd.Req
		case cmd.Op == OpSetValue && rs[i].Status == StatusOK:
			// One overtaken by a later SetValue of the holder is answered
			// OK and sets nothing.
			t := ref{cmd.Session, cmd.Target}
			if cmd.Req >= c.lastReq[t] {
				c.values[t], c.lastReq[t] = cmd.Value, cmd.Req
			}
		}
	}
	for key, k := range c.s.keys {
		for _, list := range [2][]ref{k.holders(), k.waiters()} {
			for _, h := range list {
				if got, want := c.s.values[h], c.values[h]; !bytes.Equal(got, want) {
					return fmt.Errorf("key %q: attempt (%d,%d) has value %q, its commands set %q", key, h.session, h.req, got, want)
				}
			}
		}
	}
	return nil
}

// checkEvents applies the entry's events to the mirror and checks it
// against the state: a watcher that starts from a snapshot and applies
// every entry's events sees every key as it is.
func (c *checker) checkEvents(es []Event) error {
	drop := func(list []Holder, e Event) ([]Holder, bool) {
		i := slices.IndexFunc(list, func(h Holder) bool { return h.Session == e.Session && h.Req == e.Req })
		if i < 0 {
			return list, false
		}
		return slices.Delete(list, i, i+1), true
	}
	for _, e := range es {
		m := c.mirror[e.Key]
		if m == nil {
			m = &mirrorKey{}
			c.mirror[e.Key] = m
		}
		h := Holder{Session: e.Session, Req: e.Req, Token: e.Token, Owner: e.Owner, Label: e.Label, Kind: e.Lock, Permits: e.Permits, Value: e.Value}
		var ok bool
		switch e.Kind {
		case EventGranted:
			m.waiters, _ = drop(m.waiters, e)
			m.holders, ok = append(m.holders, h), true
		case EventQueued:
			h.Token = 0
			if ok = e.Position >= 0 && e.Position <= len(m.waiters); ok {
				m.waiters = slices.Insert(m.waiters, e.Position, h)
			}
		case EventReleased, EventExpired:
			m.holders, ok = drop(m.holders, e)
		case EventCancelled:
			m.waiters, ok = drop(m.waiters, e)
		case EventValue:
			i := slices.IndexFunc(m.holders, func(h Holder) bool { return h.Session == e.Session && h.Req == e.Req })
			if ok = i >= 0; ok {
				m.holders[i].Value = e.Value
			}
		}
		if !ok {
			return fmt.Errorf("event %v of (%d,%d) on %q: no such holder or waiter in the watcher's view", e.Kind, e.Session, e.Req, e.Key)
		}
		if len(m.holders) == 0 && len(m.waiters) == 0 {
			delete(c.mirror, e.Key)
		}
	}
	norm := func(hs []Holder) []Holder {
		if len(hs) == 0 {
			return nil
		}
		out := slices.Clone(hs)
		for i := range out {
			if len(out[i].Value) == 0 {
				out[i].Value = nil
			}
		}
		return out
	}
	for key := range c.s.keys {
		if c.mirror[key] == nil {
			return fmt.Errorf("key %q is held or waited for, and no event said so", key)
		}
	}
	for key, m := range c.mirror {
		info, ok := c.s.Key(key)
		if !ok {
			return fmt.Errorf("key %q: the events leave %d holders and %d waiters; the state has none", key, len(m.holders), len(m.waiters))
		}
		if !reflect.DeepEqual(norm(m.holders), norm(info.Holders)) || !reflect.DeepEqual(norm(m.waiters), norm(info.Waiters)) {
			return fmt.Errorf("key %q: the events say holders %+v waiters %+v; the state has %+v and %+v", key, m.holders, m.waiters, info.Holders, info.Waiters)
		}
	}
	return nil
}

// mirrorOf is every key of s as a watcher's snapshot shows it.
func mirrorOf(s *State) map[string]*mirrorKey {
	m := map[string]*mirrorKey{}
	for key := range s.keys {
		info, _ := s.Key(key)
		m[key] = &mirrorKey{holders: info.Holders, waiters: info.Waiters}
	}
	return m
}

func snapshot(t testing.TB, s *State) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := s.Save(&buf); err != nil {
		t.Fatalf("Save: %v", err)
	}
	return buf.Bytes()
}

// byteStream hands out fuzz or random bytes one at a time, then zeros.
type byteStream struct{ data []byte }

func (b *byteStream) next() byte {
	if len(b.data) == 0 {
		return 0
	}
	c := b.data[0]
	b.data = b.data[1:]
	return c
}

func (b *byteStream) more() bool { return len(b.data) > 0 }

// applyAt returns a function that applies each entry it is given to s at
// the next index.
func applyAt(s *State) func(cmds ...Command) []Result {
	index := s.Index()
	return func(cmds ...Command) []Result {
		index++
		rs, _ := s.Apply(index, cmds)
		return rs
	}
}

// genLog turns bytes into a log of entries over a small domain (a few
// sessions, keys and request ids) so that collisions, hand-offs, duplicates
// and expiries are frequent. Session ids are guessed from the entry indexes,
// so some commands hit closed or never-opened sessions.
func genLog(data []byte) [][]Command {
	in := &byteStream{data}
	next := in.next
	keys := []string{"a", "b", "c", "dir/x"}
	var log [][]Command
	for in.more() && len(log) < 256 {
		n := int(next()%4) + 1
		entry := make([]Command, 0, n)
		for i := 0; i < n && in.more(); i++ {
			b := next()
			c := Command{
				Session: uint64(next() % 12),
				Req:     uint64(next() % 16),
				Ack:     uint64(next() % 8),
				Key:     keys[next()%uint8(len(keys))],
				Wait:    b&0x80 != 0,
				Limit:   uint32(b>>4) % 3,
				Target:  uint64(next() % 16),
			}
			switch b % 16 {
			case 0, 1:
				c.Op = OpOpenSession
				c.Owner = fmt.Sprintf("n%d", b%3)
				c.TTLMillis = 1000
				if b&0x40 != 0 {
					c.Label = uint64(b)<<32 | 1
				}
				c.Capped = b&0x20 != 0
			case 2, 3, 4, 5, 6:
				c.Op = OpAcquire
				if b&0x40 != 0 { // the lock family
					x := next()
					c.Kind = Kind(x % 5) // 4 is unknown
					c.Flags = Flags(x>>3) & 3
					if c.Kind == KindRead || c.Kind == KindWrite {
						c.Limit = 0
					}
					if c.Kind == KindSemaphore {
						c.Limit = uint32(x>>5)%4 + 1
						c.Permits = uint32(x>>6) % 3
					}
					if x&0x80 != 0 && i+1 < n {
						// A group of 2 or 3: this and the next ones, with
						// the next request ids and other keys, now and
						// then spoiled by one field.
						size := 2 + int(x>>2)%2
						c.Group = uint16(size)
						entry = append(entry, c)
						for j := 1; j < size; j++ {
							m := c
							m.Req = c.Req + uint64(j)
							m.Key = keys[(int(next())+j)%len(keys)]
							if next()%16 == 0 {
								m.Session++
							}
							entry = append(entry, m)
						}
						i += size - 1
						continue
					}
				}
			case 7, 8, 9:
				c.Op = OpRelease
			case 10, 11:
				c.Op = OpCancel
			case 12:
				c.Op = OpExpireSession
				c.Term = uint64(next() % 3)
			case 13:
				c.Op = OpCloseSession
			case 14:
				c.Op = Op(b) // mostly unknown ops
				if b&0x40 != 0 {
					c.Op = OpLeaderTerm
					c.Term = uint64(next() % 3) // 0 is invalid
				}
			default:
				c.Op = OpAcquire
				c.Limit = 1
			}
			if c.Session == 11 {
				// A session opened by a multi-open entry: index 1, position 1.
				c.Session = extraSessionBit | 1<<12 | 1
			}
			entry = append(entry, c)
		}
		log = append(log, entry)
	}
	return log
}

// queries collects every query answer, for comparing two states.
func queries(s *State) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "index=%d stats=%+v\n", s.Index(), s.Stats())
	for _, si := range s.Sessions() {
		fmt.Fprintf(&b, "session %+v\n", si)
		for req := uint64(0); req < 17; req++ {
			info, ok := s.Request(si.ID, req)
			fmt.Fprintf(&b, "  req %d %v %+v\n", req, ok, info)
		}
	}
	fmt.Fprintf(&b, "maxHolds %+v\n", s.MaxHolds())
	for _, k := range []string{"a", "b", "c", "dir/x", "zz", "r1", "r2", "s1", "m1", "m2"} { // the generators' keys
		info, ok := s.Key(k)
		fmt.Fprintf(&b, "key %q %v %+v\n", k, ok, info)
	}
	return b.String()
}

// runLog applies log with checks, comparing a twin state fed the same log
// and a state restored from a snapshot in the middle.
func runLog(t testing.TB, log [][]Command) {
	t.Helper()
	if err := checkLog(t, log); err != nil {
		t.Fatal(err)
	}
}

// checkLog is runLog returning the first violation it finds.
func checkLog(t testing.TB, log [][]Command) error {
	t.Helper()
	return checkLogWith(t, log, brokenRules{})
}

// checkLogWith is checkLog on States with broken rules, the restored one
// included.
func checkLogWith(t testing.TB, log [][]Command, broken brokenRules) error {
	t.Helper()
	a, b := newCheckerWith(broken), newCheckerWith(broken)
	var restored *checker
	half := len(log) / 2
	for i, entry := range log {
		ra, ga, err := a.apply(entry...)
		if err != nil {
			return fmt.Errorf("%v\nentry: %+v", err, entry)
		}
		rb, gb, _ := b.apply(entry...)
		if !reflect.DeepEqual(ra, rb) || !slices.EqualFunc(ga, gb, func(x, y Grant) bool { return x == y }) {
			return fmt.Errorf("entry %d: twins disagree:\n%+v %+v\n%+v %+v", i, ra, ga, rb, gb)
		}
		if restored != nil {
			rr, gr, err := restored.apply(entry...)
			if err != nil {
				return fmt.Errorf("restored: %v", err)
			}
			if !reflect.DeepEqual(ra, rr) || !slices.Equal(ga, gr) {
				return fmt.Errorf("entry %d: restored state disagrees:\n%+v %+v\n%+v %+v", i, ra, ga, rr, gr)
			}
		}
		if i == half {
			snap := snapshot(t, a.s)
			restored = newCheckerWith(broken)
			if err := restored.s.Load(bytes.NewReader(snap)); err != nil {
				return fmt.Errorf("Load of a saved snapshot: %v", err)
			}
			restored.index = a.index
			maps.Copy(restored.lastToken, a.lastToken)
			maps.Copy(restored.values, a.values)
			restored.mirror = mirrorOf(restored.s) // a watcher starts from the snapshot
			maps.Copy(restored.set, a.set)
			maps.Copy(restored.lastReq, a.lastReq)
			if again := snapshot(t, restored.s); !bytes.Equal(snap, again) {
				return fmt.Errorf("Save after Load differs")
			}
			if qa, qr := queries(a.s), queries(restored.s); qa != qr {
				return fmt.Errorf("queries differ after Load:\n%s\n%s", qa, qr)
			}
		}
	}
	sa, sb := snapshot(t, a.s), snapshot(t, b.s)
	if !bytes.Equal(sa, sb) {
		return fmt.Errorf("twin snapshots differ")
	}
	if restored != nil {
		if sr := snapshot(t, restored.s); !bytes.Equal(sa, sr) {
			return fmt.Errorf("snapshot of the restored state differs from never snapshotting")
		}
	}
	return nil
}

// genFamilyLog turns bytes into a log that drives the lock family: four
// sessions stay open (reopened when they end), each with its own rising
// request ids, taking read/write keys, a semaphore of 3 permits, mutexes
// and groups of them, waiting or not and with the deadlock check or not,
// releasing and cancelling what it asked for, now and then expiring or
// closing. Keys keep their roles, so most commands are served rather than
// refused.
func genFamilyLog(data []byte) [][]Command {
	in := &byteStream{data}
	next := in.next
	type kk struct {
		key  string
		kind func(b byte) (Kind, uint32, uint32) // kind, limit, permits
	}
	rw := func(b byte) (Kind, uint32, uint32) {
		if b%3 == 0 {
			return KindWrite, 0, 0
		}
		return KindRead, 0, 0
	}
	semaphore := func(b byte) (Kind, uint32, uint32) {
		if b%16 == 15 {
			return KindSemaphore, 4, 1 // disagrees with the others' 3
		}
		return KindSemaphore, 3, uint32(b%3) + 1
	}
	mutex := func(byte) (Kind, uint32, uint32) { return KindMutex, 0, 0 }
	keys := []kk{{"r1", rw}, {"r2", rw}, {"s1", semaphore}, {"m1", mutex}, {"m2", mutex}}

	var log [][]Command
	ids := make([]uint64, 4)  // live session ids by slot; 0: to open
	reqs := make([]uint64, 4) // last request id by slot
	term := uint64(0)         // the last LeaderTerm proposed
	for in.more() && len(log) < 300 {
		index := uint64(len(log) + 1)
		var entry []Command
		for slot := range ids {
			if ids[slot] == 0 {
				entry = append(entry, Command{Op: OpOpenSession, Owner: fmt.Sprintf("n%d", slot), TTLMillis: 1000, Label: uint64(slot) + 1, Capped: true})
				ids[slot], reqs[slot] = index, 0
				break // one open per entry keeps ids equal to the index
			}
		}
		for n := int(next()%3) + 1; n > 0 && in.more(); n-- {
			b := next()
			slot := int(b % 4)
			sess := ids[slot]
			if sess == 0 || sess == index {
				continue
			}
			wait := b&0x20 != 0
			flags := Flags(b>>6) & (FlagDetail | FlagDeadlock)
			switch op := next() % 16; {
			case op < 6: // one acquire, some with a maximum hold
				k := keys[int(next())%len(keys)]
				kind, limit, permits := k.kind(next())
				reqs[slot]++
				c := Command{Op: OpAcquire, Session: sess, Req: reqs[slot], Key: k.key, Wait: wait,
					Kind: kind, Limit: limit, Permits: permits, Flags: flags}
				if b&0x10 != 0 {
					c.MaxHoldMillis = 500
				}
				if b&0x08 != 0 {
					c.Value = fmt.Appendf(nil, "v%d.%d", slot, reqs[slot])
				}
				if b&0x04 != 0 {
					c.Priority = next() % 3 // with FlagDeadlock: refused
				}
				entry = append(entry, c)
			case op < 7: // the leader: a new term, or a hold ended in this term or a stale one
				if b&1 == 0 {
					term++
					entry = append(entry, Command{Op: OpLeaderTerm, Term: term})
				} else {
					entry = append(entry, Command{Op: OpExpireHold, Session: sess, Target: max(reqs[slot], 1) - uint64(next()%2), Term: term - uint64(next()%4/3)})
				}
			case op < 9: // a group of two or three keys
				size := 2 + int(next()%2)
				first := int(next())
				reqs[slot]++
				base := reqs[slot]
				reqs[slot] += uint64(size - 1)
				for j := range size {
					k := keys[(first+j)%len(keys)]
					kind, limit, permits := k.kind(next())
					entry = append(entry, Command{Op: OpAcquire, Session: sess, Req: base + uint64(j), Key: k.key, Wait: wait,
						Kind: kind, Limit: limit, Permits: permits, Group: uint16(size), Flags: flags})
				}
			case op < 10: // set the value of an earlier request, or clear it
				if reqs[slot] == 0 {
					continue
				}
				target := reqs[slot] - uint64(next())%min(reqs[slot], 4)
				reqs[slot]++
				c := Command{Op: OpSetValue, Session: sess, Req: reqs[slot], Target: target}
				if b&0x08 != 0 {
					c.Value = fmt.Appendf(nil, "set%d.%d", slot, reqs[slot])
				}
				entry = append(entry, c)
			case op < 13: // release an earlier request
				if reqs[slot] == 0 {
					continue
				}
				target := reqs[slot] - uint64(next())%min(reqs[slot], 4)
				reqs[slot]++
				entry = append(entry, Command{Op: OpRelease, Session: sess, Req: reqs[slot], Target: target})
			case op < 15: // cancel an earlier request
				if reqs[slot] == 0 {
					continue
				}
				target := reqs[slot] - uint64(next())%min(reqs[slot], 3)
				reqs[slot]++
				entry = append(entry, Command{Op: OpCancel, Session: sess, Req: reqs[slot], Target: target})
			default: // end the session
				if b&1 == 0 {
					entry = append(entry, Command{Op: OpCloseSession, Session: sess})
				} else {
					entry = append(entry, Command{Op: OpExpireSession, Session: sess})
				}
				ids[slot] = 0
			}
		}
		if len(entry) == 0 {
			entry = append(entry, Command{Op: OpLeaderTerm, Term: 0}) // invalid: a no-op entry
		}
		log = append(log, entry)
	}
	return log
}
