package lockfsm

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// shardPair is two shards' states and a Session (label) with one session
// on each: the session of label l on either shard has id l (opened at
// index l).
type shardPair struct {
	s     [2]*State
	index [2]uint64
}

func newShardPair(t *testing.T, labels int) *shardPair {
	p := &shardPair{s: [2]*State{New(), New()}}
	for i := range p.s {
		for l := 1; l <= labels; l++ {
			p.apply(t, i, Command{Op: OpOpenSession, Owner: fmt.Sprintf("n%d", l), TTLMillis: 5000, Label: uint64(l)})
		}
	}
	return p
}

func (p *shardPair) apply(t *testing.T, shard int, cmds ...Command) []Result {
	t.Helper()
	p.index[shard]++
	rs, _ := p.s[shard].Apply(p.index[shard], cmds)
	if err := p.s[shard].Verify(); err != nil {
		t.Fatalf("shard %d: %v", shard, err)
	}
	return rs
}

func (p *shardPair) waits(t *testing.T) []ShardWaits {
	t.Helper()
	var out []ShardWaits
	for i, s := range p.s {
		keys, complete := s.WaitGraph(1 << 20)
		if !complete {
			t.Fatal("WaitGraph cut short")
		}
		out = append(out, ShardWaits{Shard: uint64(i + 1), Keys: keys})
	}
	return out
}

// Two Sessions, each holding a key on one shard and waiting for the
// other's on the other shard: neither shard sees the cycle, StuckWaits
// does, names it, and picks the higher label's wait as the victim.
func TestStuckWaitsAcrossShards(t *testing.T) {
	p := newShardPair(t, 2)
	p.apply(t, 0, acq(1, 1, "a", true))
	p.apply(t, 1, acq(2, 1, "b", true))
	if rs := p.apply(t, 0, waitDL(acq(2, 2, "a", true))); rs[0].Status != StatusQueued {
		t.Fatalf("shard 1: %+v", rs[0])
	}
	if got := StuckWaits(p.waits(t)); len(got) != 0 {
		t.Fatalf("stuck before the cycle closes: %+v", got)
	}
	if rs := p.apply(t, 1, waitDL(acq(1, 2, "b", true))); rs[0].Status != StatusQueued {
		t.Fatalf("shard 2 saw the cycle: %+v", rs[0])
	}
	got := StuckWaits(p.waits(t))
	if len(got) != 2 {
		t.Fatalf("stuck %+v, want both waits", got)
	}
	for _, st := range got {
		if st.Victim != (st.Waiter.Label == 2) {
			t.Errorf("wait of session %d: victim %v", st.Waiter.Label, st.Victim)
		}
		if !strings.Contains(st.Why, `session 2 (n2) waits for "a", held by session 1 (n1)`) || !strings.Contains(st.Why, `session 1 (n1) waits for "b", held by session 2 (n2)`) {
			t.Errorf("why: %s", st.Why)
		}
	}
	// The victim's wait withdrawn, nothing is stuck.
	p.apply(t, 0, cancel(2, 2))
	if got := StuckWaits(p.waits(t)); len(got) != 0 {
		t.Fatalf("stuck after the victim left: %+v", got)
	}
}

// crossOracle is StuckWaits' oracle: it releases, through Apply on both
// shards, everything a Session holds while none of its sessions waits
// with the flag, until nothing moves, and returns the flagged waits left.
func crossOracle(t *testing.T, p *shardPair, labels int) []string {
	c := &shardPair{index: p.index}
	for i := range p.s {
		c.s[i] = New()
		if err := c.s[i].Load(strings.NewReader(string(snapshot(t, p.s[i])))); err != nil {
			t.Fatal(err)
		}
	}
	blocked := func(l uint64) bool {
		for _, s := range c.s {
			for _, at := range s.sessions[l].reqs {
				if at.state == ReqWaiting && at.deadlock {
					return true
				}
			}
		}
		return false
	}
	for moved := true; moved; {
		moved = false
		for l := uint64(1); l <= uint64(labels); l++ {
			if blocked(l) {
				continue
			}
			for i, s := range c.s {
				for _, req := range s.sessions[l].reqsIn(ReqHeld) {
					c.apply(t, i, rel(l, req))
					moved = true
				}
			}
		}
	}
	var stuck []string
	for i, s := range c.s {
		for l := uint64(1); l <= uint64(labels); l++ {
			for req, at := range s.sessions[l].reqs {
				if at.state == ReqWaiting && at.deadlock {
					stuck = append(stuck, fmt.Sprintf("%d/%d/%d", i+1, l, req))
				}
			}
		}
	}
	slices.Sort(stuck)
	return stuck
}

// On random two-shard workloads (every wait flagged, each shard's own
// check refusing what it sees), StuckWaits finds exactly the waits the
// oracle leaves stuck, refusing its victims round after round ends every
// deadlock; on one shard it finds none, since the check refused every
// cycle there.
func TestStuckWaitsAgreesWithTheOracle(t *testing.T) {
	found, err := crossShardRuns(t, 200, brokenRules{})
	if err != nil {
		t.Fatal(err)
	}
	if found < 100 {
		t.Fatalf("only %d stuck waits found in 200 workloads: the workloads do not reach cross-shard deadlocks", found)
	}
	t.Logf("%d stuck waits found, each as the oracle says", found)
}

// A play that takes each shard's session for a thread of its own misses
// every cross-shard cycle, and the oracle catches it.
func TestStuckWaitsBrokenVariantIsCaught(t *testing.T) {
	if _, err := crossShardRuns(t, 200, brokenRules{crossShardBySession: true}); err == nil {
		t.Fatal("200 random two-shard workloads missed the broken cross-shard play")
	} else {
		t.Logf("caught: %v", err)
	}
}

// crossShardRuns plays seeds random two-shard workloads and returns the
// stuck waits found, or the first disagreement with the oracle.
func crossShardRuns(t *testing.T, seeds uint64, broken brokenRules) (found int, err error) {
	const labels = 4
	for seed := uint64(1); seed <= seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		p := newShardPair(t, labels)
		next := map[uint64]uint64{}
		for step := 0; step < 60; step++ {
			l := uint64(1 + r.IntN(labels))
			shard := r.IntN(2)
			s := p.s[shard]
			switch op := r.IntN(10); {
			case op < 6:
				next[l]++
				cmd := waitDL(Command{Op: OpAcquire, Session: l, Req: next[l]})
				switch r.IntN(3) {
				case 0:
					cmd.Key = []string{"x", "y"}[r.IntN(2)]
				case 1:
					cmd.Key, cmd.Kind = "rw", []Kind{KindRead, KindWrite}[r.IntN(2)]
				default:
					cmd.Key, cmd.Kind, cmd.Limit, cmd.Permits = "s", KindSemaphore, 2, uint32(1+r.IntN(2))
				}
				p.apply(t, shard, cmd)
			case op < 9:
				if held := s.sessions[l].reqsIn(ReqHeld); len(held) > 0 {
					p.apply(t, shard, rel(l, held[r.IntN(len(held))]))
				}
			default:
				if waiting := s.sessions[l].reqsIn(ReqWaiting); len(waiting) > 0 {
					p.apply(t, shard, cancel(l, waiting[0]))
				}
			}
			got := stuckWaits(p.waits(t), broken)
			var names []string
			for _, st := range got {
				names = append(names, fmt.Sprintf("%d/%d/%d", st.Shard, st.Waiter.Label, st.Waiter.Req))
			}
			slices.Sort(names)
			if want := crossOracle(t, p, labels); !reflect.DeepEqual(names, want) && (len(names) > 0 || len(want) > 0) {
				return found, fmt.Errorf("seed %d step %d: StuckWaits %v, oracle %v", seed, step, names, want)
			}
			// Refusing the victims, round after round, ends every
			// deadlock; each round has a victim while anything is stuck.
			if len(got) > 0 {
				c := &shardPair{index: p.index}
				for i := range p.s {
					c.s[i] = New()
					if err := c.s[i].Load(strings.NewReader(string(snapshot(t, p.s[i])))); err != nil {
						t.Fatal(err)
					}
				}
				for round := 0; ; round++ {
					left := stuckWaits(c.waits(t), broken)
					if len(left) == 0 {
						break
					}
					refused := 0
					for _, st := range left {
						if st.Victim {
							c.apply(t, int(st.Shard-1), cancel(st.Waiter.Session, st.Waiter.Req))
							refused++
						}
					}
					if refused == 0 || round > 20 {
						return found, fmt.Errorf("seed %d step %d: round %d leaves %+v stuck with no victim", seed, step, round, left)
					}
				}
			}
			found += len(got)
			for i, s := range p.s {
				keys, _ := s.WaitGraph(1 << 20)
				if one := stuckWaits([]ShardWaits{{Shard: uint64(i + 1), Keys: keys}}, broken); len(one) != 0 {
					return found, fmt.Errorf("seed %d step %d: shard %d alone has stuck waits its check let queue: %+v", seed, step, i+1, one)
				}
			}
		}
	}
	return found, nil
}

// FuzzStuckWaits feeds StuckWaits wait graphs as another peer might send
// them, well-formed or not (a group whose members are missing, on one key
// twice or past MaxGroup, a key of limit 0, an attempt listed twice): it
// must return, never panic, give the same answer twice, and name a wait
// and a reason for every stuck one.
func FuzzStuckWaits(f *testing.F) {
	f.Add([]byte{0x01, 0x12, 0x23, 0x34, 0x45, 0x56, 0x67, 0x78, 0x89, 0x9a})
	f.Add([]byte("\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\xf0\xe1\xd2\xc3"))
	f.Fuzz(func(t *testing.T, data []byte) {
		next := (&byteStream{data}).next
		var shards []ShardWaits
		for s := range uint64(1 + next()%3) {
			sw := ShardWaits{Shard: s + 1}
			for k := range int(next() % 4) {
				wk := WaitKey{Key: fmt.Sprintf("k%d", k), Role: Kind(next() % 5), Limit: uint32(next() % 4)}
				for j := range 2 {
					for range int(next() % 4) {
						b, c := next(), next()
						wa := WaitAttempt{
							Holder:  Holder{Session: uint64(b%4) + 1, Req: uint64(c % 8), Label: uint64(b>>2) % 5, Kind: Kind(c>>3) % 5, Permits: uint32(c>>6) % 4},
							Group:   uint16(next() % 70),
							Flagged: b&0x80 != 0,
						}
						wa.First = wa.Req - uint64(next()%4)
						if j == 0 {
							wk.Holders = append(wk.Holders, wa)
						} else {
							wk.Waiters = append(wk.Waiters, wa)
						}
					}
				}
				sw.Keys = append(sw.Keys, wk)
			}
			shards = append(shards, sw)
		}
		got := StuckWaits(shards)
		if again := StuckWaits(shards); !reflect.DeepEqual(got, again) {
			t.Fatalf("two plays of one graph differ:\n%+v\n%+v", got, again)
		}
		for _, st := range got {
			if st.Why == "" || st.Key == "" || !st.Waiter.Flagged {
				t.Fatalf("stuck wait without a key, a reason or the flag: %+v", st)
			}
		}
	})
}

// A cycle may run through a Session that holds nothing, queued behind a
// group: its peer does not check it (it can be in no cycle of its own
// making), so the victim is the highest label among the cycle's Sessions
// that hold a key.
func TestStuckWaitsVictimHoldsAKey(t *testing.T) {
	const tl, s1, s2 = 1, 2, 3 // s2, queued with a group, holds nothing
	p := newShardPair(t, 3)
	p.apply(t, 0, acq(tl, 1, "k", true))
	p.apply(t, 0, group(waitDL(acq(s2, 1, "k", true)), waitDL(acq(s2, 2, "m", true)))...)
	if rs := p.apply(t, 0, waitDL(acq(s1, 1, "m", true))); rs[0].Status != StatusQueued {
		t.Fatalf("s1 behind s2's group: %+v", rs[0])
	}
	p.apply(t, 1, acq(s1, 2, "a", true))
	if rs := p.apply(t, 1, waitDL(acq(tl, 2, "a", true))); rs[0].Status != StatusQueued {
		t.Fatalf("t waiting for a: %+v", rs[0])
	}
	victims := 0
	for _, st := range StuckWaits(p.waits(t)) {
		if st.Victim {
			victims++
			if st.Waiter.Label != s1 {
				t.Errorf("victim: the wait of session %d, want %d (the highest label that holds a key)", st.Waiter.Label, s1)
			}
		}
		if strings.Contains(st.Why, "nothing that waits could free") {
			t.Errorf("wait of session %d explained as %q", st.Waiter.Label, st.Why)
		}
	}
	if victims != 1 {
		t.Fatalf("%d victims, want 1", victims)
	}
}
