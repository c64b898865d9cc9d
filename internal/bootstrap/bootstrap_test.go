package bootstrap

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// The bootstrap rules are driven with made-up members and times: no
// gossip, no RPC, no clock.

// free is an alive member that belongs to no cluster and can found one.
func free(name string) mesh.Member {
	return mesh.Member{Name: name, State: mesh.StateAlive, Meta: mesh.Meta{
		NodeHostID: "nh-" + name, RPCAddr: name + ":7000", MaxLevel: 2, MinLevel: 1}}
}

func with(m mesh.Member, change func(*mesh.Member)) mesh.Member {
	change(&m)
	return m
}

func names(ms []mesh.Member) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.Name)
	}
	return out
}

// Rule 1, rule by rule.
func TestDecide(t *testing.T) {
	inCluster := func(m *mesh.Member) { m.Meta.Cluster = 99 }
	joinOnly := func(m *mesh.Member) { m.Meta.JoinOnly = true }
	noReplicas := func(m *mesh.Member) { m.Meta.NoReplicas = true }
	cases := []struct {
		name     string
		members  []mesh.Member
		self     string
		expect   int
		adopt    string   // AdoptFrom's name, "" for none
		founders []string // nil: none
	}{
		{name: "too few free peers: wait", members: []mesh.Member{free("a"), free("b")}, self: "a", expect: 3},
		{name: "first by name coordinates", members: []mesh.Member{free("a"), free("b"), free("c")}, self: "a", expect: 3,
			founders: []string{"a", "b", "c"}},
		{name: "others wait", members: []mesh.Member{free("a"), free("b"), free("c")}, self: "b", expect: 3},
		{name: "unsorted input is read by name", members: []mesh.Member{free("c"), free("a"), free("b")}, self: "a", expect: 3,
			founders: []string{"a", "b", "c"}},
		{name: "only the first N by name found", members: []mesh.Member{free("a"), free("b"), free("c"), free("d")}, self: "a", expect: 3,
			founders: []string{"a", "b", "c"}},
		{name: "a peer past the first N waits", members: []mesh.Member{free("a"), free("b"), free("c"), free("d")}, self: "d", expect: 3},
		{name: "expect 0 never forms", members: []mesh.Member{free("a")}, self: "a", expect: 0},
		{name: "a member in a cluster is adopted from", members: []mesh.Member{free("a"), with(free("b"), inCluster), free("c")}, self: "a", expect: 3,
			adopt: "b"},
		{name: "the first such member by name", members: []mesh.Member{free("a"), with(free("c"), inCluster), with(free("b"), inCluster)}, self: "a", expect: 1,
			adopt: "b"},
		{name: "a joiner adopts too", members: []mesh.Member{with(free("a"), joinOnly), with(free("b"), inCluster)}, self: "a", expect: 0,
			adopt: "b"},
		{name: "its own cluster id is not another cluster", members: []mesh.Member{with(free("a"), inCluster), free("b")}, self: "a", expect: 2,
			founders: []string{"a", "b"}},
		{name: "a join-only member is not counted", members: []mesh.Member{free("b"), free("c"), with(free("x"), joinOnly)}, self: "b", expect: 3},
		{name: "a join-only member is not chosen to coordinate", members: []mesh.Member{with(free("a"), joinOnly), free("b"), free("c"), free("d")}, self: "b", expect: 3,
			founders: []string{"b", "c", "d"}},
		{name: "a NoReplicas member is not counted", members: []mesh.Member{free("b"), free("c"), with(free("x"), noReplicas)}, self: "b", expect: 3},
		{name: "a NoReplicas member is not chosen to coordinate", members: []mesh.Member{with(free("a"), noReplicas), free("b"), free("c"), free("d")}, self: "b", expect: 3,
			founders: []string{"b", "c", "d"}},
		{name: "a member without a NodeHostID does not count", members: []mesh.Member{with(free("a"), func(m *mesh.Member) { m.Meta.NodeHostID = "" }), free("b"), free("c")}, self: "b", expect: 2,
			founders: []string{"b", "c"}},
		{name: "nor one without an RPC address", members: []mesh.Member{with(free("a"), func(m *mesh.Member) { m.Meta.RPCAddr = "" }), free("b"), free("c")}, self: "b", expect: 2,
			founders: []string{"b", "c"}},
		{name: "nor a member not alive", members: []mesh.Member{with(free("a"), func(m *mesh.Member) { m.State = mesh.StateAlive + 1 }), free("b"), free("c")}, self: "b", expect: 2,
			founders: []string{"b", "c"}},
		{name: "a member in a cluster without an RPC address is not adopted from", members: []mesh.Member{with(free("a"), func(m *mesh.Member) { m.Meta.Cluster, m.Meta.RPCAddr = 9, "" }), free("b")}, self: "b", expect: 1,
			founders: []string{"b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := slices.Clone(c.members)
			f := Decide(c.members, c.self, c.expect)
			if !slices.EqualFunc(before, c.members, func(a, b mesh.Member) bool { return a == b }) {
				t.Fatal("Decide modified its input")
			}
			adopt := ""
			if f.AdoptFrom != nil {
				adopt = f.AdoptFrom.Name
			}
			if adopt != c.adopt || !slices.Equal(names(f.Founders), c.founders) {
				t.Fatalf("Decide = adopt %q founders %v, want adopt %q founders %v", adopt, names(f.Founders), c.adopt, c.founders)
			}
			if f.AdoptFrom != nil && f.Founders != nil {
				t.Fatal("Decide both adopts and forms")
			}
		})
	}
}

func TestNewPlan(t *testing.T) {
	founders := []mesh.Member{free("a"), free("b"), free("c")}
	p := NewPlan(7, 4, 3, 2, founders)
	if p.ClusterID != 7 || p.Shards != 4 || p.Level != 2 || p.KeyScheme != layout.KeySchemeHashTag {
		t.Fatalf("plan = cluster %d shards %d level %d scheme %d", p.ClusterID, p.Shards, p.Level, p.KeyScheme)
	}
	for _, m := range founders {
		if pe, ok := p.Peer(m.Name); !ok || pe.NodeHostID != m.Meta.NodeHostID {
			t.Fatalf("plan lists %s as %+v, %v", m.Name, pe, ok)
		}
	}
	// A founder of level 1 (a release before levels) holds the cluster
	// to level 1 and whole-key hashing.
	founders[1].Meta.MaxLevel, founders[1].Meta.MinLevel = 0, 0
	p = NewPlan(7, 4, 3, 2, founders)
	if p.Level != 1 || p.KeyScheme != layout.KeySchemeWhole {
		t.Fatalf("plan with a level-1 founder = level %d scheme %d, want 1, whole keys", p.Level, p.KeyScheme)
	}
	// Pure: the same inputs give the same bytes.
	a, _ := layout.Encode(NewPlan(7, 4, 3, 2, founders))
	b, _ := layout.Encode(NewPlan(7, 4, 3, 2, founders))
	if string(a) != string(b) {
		t.Fatal("NewPlan is not deterministic")
	}
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// plan returns a plan of cluster id over a, b, c and its encoding.
func plan(t *testing.T, id uint64) (*layout.Placement, []byte) {
	t.Helper()
	p := NewPlan(id, 2, 3, 2, []mesh.Member{free("a"), free("b"), free("c")})
	raw, err := layout.Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, raw
}

// Rule 2: a promise refuses another plan until it lapses.
func TestPromiseRefusesAnotherPlanUntilItLapses(t *testing.T) {
	p1, raw1 := plan(t, 1)
	p2, raw2 := plan(t, 3)
	var ps Promises
	if err := ps.Prepare(p1, raw1, at(0)); err != nil {
		t.Fatalf("first promise: %v", err)
	}
	for _, d := range []time.Duration{0, time.Second, PromiseTTL - time.Nanosecond} {
		if err := ps.Prepare(p2, raw2, at(d)); !errors.Is(err, ErrPromised) {
			t.Fatalf("another plan %v after the promise: %v, want ErrPromised", d, err)
		}
	}
	if string(ps.Promised()) != string(raw1) {
		t.Fatal("a refused plan replaced the promise")
	}
	// The same plan renews the promise.
	if err := ps.Prepare(p1, raw1, at(5*time.Second)); err != nil {
		t.Fatalf("the same plan again: %v", err)
	}
	if err := ps.Prepare(p2, raw2, at(PromiseTTL)); !errors.Is(err, ErrPromised) {
		t.Fatalf("another plan before the renewed promise lapsed: %v, want ErrPromised", err)
	}
	if err := ps.Prepare(p2, raw2, at(5*time.Second+PromiseTTL)); err != nil {
		t.Fatalf("another plan once the promise lapsed: %v", err)
	}
	if string(ps.Promised()) != string(raw2) {
		t.Fatal("the lapsed promise was not replaced")
	}
}

// Rule 3: an abort from the plan's cluster id clears it; any other does
// nothing.
func TestAbortClearsOnlyItsOwnPlan(t *testing.T) {
	p1, raw1 := plan(t, 1)
	p2, raw2 := plan(t, 3)
	var ps Promises
	if ps.Abort(1) {
		t.Fatal("abort with no promise withdrew one")
	}
	if err := ps.Prepare(p1, raw1, at(0)); err != nil {
		t.Fatal(err)
	}
	if ps.PromiseFor(3) != nil || ps.Abort(3) {
		t.Fatal("abort of another cluster id withdrew the promise")
	}
	if string(ps.Promised()) != string(raw1) {
		t.Fatal("the promise is gone after another cluster's abort")
	}
	if ps.PromiseFor(1) != p1 {
		t.Fatal("PromiseFor(1) is not the promised plan")
	}
	if !ps.Abort(1) {
		t.Fatal("abort of the promised cluster id withdrew nothing")
	}
	if ps.Promised() != nil || ps.PromiseFor(1) != nil {
		t.Fatal("the promise survived its abort")
	}
	// Withdrawn, it refuses nothing.
	if err := ps.Prepare(p2, raw2, at(time.Second)); err != nil {
		t.Fatalf("another plan after the abort: %v", err)
	}
}

// Rule 4: a commit is adopted only for the promised bytes, lapsed or not.
func TestCommitOnlyOfThePromisedBytes(t *testing.T) {
	p1, raw1 := plan(t, 1)
	_, raw2 := plan(t, 3)
	var ps Promises
	if err := authz.BootstrapCommit(ps.Promised(), raw1); err == nil {
		t.Fatal("a commit with no promise was accepted")
	}
	if err := ps.Prepare(p1, raw1, at(0)); err != nil {
		t.Fatal(err)
	}
	if err := authz.BootstrapCommit(ps.Promised(), raw1); err != nil {
		t.Fatalf("commit of the promised plan: %v", err)
	}
	if err := authz.BootstrapCommit(ps.Promised(), raw2); err == nil {
		t.Fatal("commit of another plan was accepted")
	}
	tampered := slices.Clone(raw1)
	tampered[len(tampered)-1] ^= 1
	if err := authz.BootstrapCommit(ps.Promised(), tampered); err == nil {
		t.Fatal("commit of the promised plan with one bit changed was accepted")
	}
	// Lapsing alone withdraws nothing (Promised reads no time): the
	// coordinator's late commit still lands. Once another plan replaced
	// the lapsed promise, only that plan's commit does.
	p2, _ := plan(t, 3)
	if err := ps.Prepare(p2, raw2, at(PromiseTTL)); err != nil {
		t.Fatal(err)
	}
	if err := authz.BootstrapCommit(ps.Promised(), raw1); err == nil {
		t.Fatal("commit of a replaced promise was accepted")
	}
	if err := authz.BootstrapCommit(ps.Promised(), raw2); err != nil {
		t.Fatalf("commit of the plan that replaced it: %v", err)
	}
	ps.Settle()
	if err := authz.BootstrapCommit(ps.Promised(), raw2); err == nil {
		t.Fatal("a commit after the promise was settled was accepted")
	}
}

// N+1 peers start at once and see different N-peer views: two peers each
// coordinate, over overlapping sets of founders. Whatever the order their
// prepares arrive in, they never both get every promise.
func TestNPlusOneCoordinatorsNeverBothFound(t *testing.T) {
	const n = 3
	all := []mesh.Member{free("a"), free("b"), free("c"), free("d")}
	// a sees a, b, c; b has not heard from a yet and sees b, c, d.
	viewA, viewB := all[:3], all[1:]
	fa, fb := Decide(viewA, "a", n), Decide(viewB, "b", n)
	if len(fa.Founders) != n || len(fb.Founders) != n {
		t.Fatalf("want two coordinators, got founders %v and %v", names(fa.Founders), names(fb.Founders))
	}
	type coordinator struct {
		plan     *layout.Placement
		raw      []byte
		founders []mesh.Member
	}
	coords := make([]coordinator, 2)
	for i, f := range []Formation{fa, fb} {
		p := NewPlan(uint64(2*i+1), 2, 3, 2, f.Founders)
		raw, err := layout.Encode(p)
		if err != nil {
			t.Fatal(err)
		}
		coords[i] = coordinator{p, raw, f.Founders}
	}
	// Every interleaving of the two coordinators' prepares (each goes
	// through its founders in order and stops at the first refusal, as
	// package node does), all within one PromiseTTL.
	var interleave func(order []int, left [2]int)
	count := 0
	interleave = func(order []int, left [2]int) {
		if left[0] == 0 && left[1] == 0 {
			count++
			tables := map[string]*Promises{}
			for _, m := range all {
				tables[m.Name] = &Promises{}
			}
			next, refused := [2]int{}, [2]bool{}
			for step, who := range order {
				if refused[who] {
					continue
				}
				c := coords[who]
				m := c.founders[next[who]]
				next[who]++
				if err := tables[m.Name].Prepare(c.plan, c.raw, at(time.Duration(step)*time.Millisecond)); err != nil {
					refused[who] = true
				}
			}
			if !refused[0] && !refused[1] {
				t.Fatalf("order %v: both coordinators got every promise", order)
			}
			return
		}
		for who := range 2 {
			if left[who] > 0 {
				l := left
				l[who]--
				interleave(append(slices.Clone(order), who), l)
			}
		}
	}
	interleave(nil, [2]int{n, n})
	if count != 20 { // (2n choose n)
		t.Fatalf("checked %d interleavings, want 20", count)
	}
}
