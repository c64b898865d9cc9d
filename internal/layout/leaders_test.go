package layout

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

// build makes a layout whose shards (the meta shard and lock shards
// 2..len(hosts)) are hosted by hosts[i] for shard i+1.
func build(t *testing.T, hosts ...[]string) *Placement {
	t.Helper()
	p := &Placement{Epoch: 1, ClusterID: 1, Shards: len(hosts) - 1, Replicas: map[uint64][]Replica{}, NextReplicaID: 1}
	names := map[string]bool{}
	for i, hs := range hosts {
		for _, h := range hs {
			names[h] = true
			p.AddReplica(uint64(i+1), h)
		}
		p.RF = max(p.RF, len(hs))
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		p.AddPeer(Peer{Name: name, NodeHostID: "nh-" + name})
	}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

// ledBy turns shard -> leading peer into shard -> leading replica id.
func ledBy(t *testing.T, p *Placement, leaders map[uint64]string) map[uint64]uint64 {
	t.Helper()
	out := map[uint64]uint64{}
	for shard, name := range leaders {
		id, ok := p.ReplicaID(shard, name)
		if !ok {
			t.Fatalf("%s hosts no replica of shard %d", name, shard)
		}
		out[shard] = id
	}
	return out
}

func TestPlanLeaderMove(t *testing.T) {
	abc := []string{"a", "b", "c"}
	six := build(t, abc, abc, abc, abc, abc, abc) // every peer hosts every shard
	cases := []struct {
		name    string
		p       *Placement
		peers   []string
		leaders map[uint64]string
		turn    int
		want    *LeaderMove // nil: no move
	}{
		{name: "all on one peer", p: six, peers: abc, turn: 0,
			leaders: map[uint64]string{1: "a", 2: "a", 3: "a", 4: "a", 5: "a", 6: "a"},
			want:    &LeaderMove{Shard: 1, From: "a", To: "c"}},
		{name: "the turn picks the shard", p: six, peers: abc, turn: 4,
			leaders: map[uint64]string{1: "a", 2: "a", 3: "a", 4: "a", 5: "a", 6: "a"},
			want:    &LeaderMove{Shard: 5, From: "a", To: "c"}},
		{name: "the turn wraps", p: six, peers: abc, turn: 6*1000 + 1,
			leaders: map[uint64]string{1: "a", 2: "a", 3: "a", 4: "a", 5: "a", 6: "a"},
			want:    &LeaderMove{Shard: 2, From: "a", To: "c"}},
		{name: "a negative turn does not panic", p: six, peers: abc, turn: -1,
			leaders: map[uint64]string{1: "a", 2: "a", 3: "a", 4: "a", 5: "a", 6: "a"},
			want:    &LeaderMove{Shard: 6, From: "a", To: "c"}},
		{name: "balanced", p: six, peers: abc,
			leaders: map[uint64]string{1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}},
		{name: "off by one is balanced", p: six, peers: abc,
			leaders: map[uint64]string{1: "a", 2: "a", 3: "b", 4: "b", 5: "c"}},
		{name: "off by two moves to the least", p: six, peers: abc,
			leaders: map[uint64]string{1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "c"},
			want:    &LeaderMove{Shard: 1, From: "a", To: "c"}},
		{name: "unknown leaders count for nobody", p: six, peers: abc,
			leaders: map[uint64]string{1: "a", 2: "a"}, // shards 3..6: no leader known
			want:    &LeaderMove{Shard: 1, From: "a", To: "c"}},
		{name: "a peer not among peers takes nothing", p: six, peers: []string{"b", "c"},
			leaders: map[uint64]string{1: "a", 2: "a", 3: "a", 4: "a", 5: "a", 6: "a"}},
		{name: "one peer", p: six, peers: []string{"a"},
			leaders: map[uint64]string{1: "a", 2: "a", 3: "a"}},
		{name: "no peers", p: six, peers: nil,
			leaders: map[uint64]string{1: "a"}},
		// a leads 1 and 2, which c does not host; b leads 3, which c does:
		// b gives c shard 3, and a can then give b one.
		{name: "through a peer in between",
			p:     build(t, []string{"a", "b"}, []string{"a", "b"}, []string{"b", "c"}),
			peers: abc, leaders: map[uint64]string{1: "a", 2: "a", 3: "b"},
			want: &LeaderMove{Shard: 3, From: "b", To: "c"}},
		// As above, but a cannot give b anything: nothing useful moves.
		{name: "stuck by the replicas",
			p:     build(t, []string{"a", "d"}, []string{"a", "d"}, []string{"b", "c"}),
			peers: abc, leaders: map[uint64]string{1: "a", 2: "a", 3: "b"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			leaders := ledBy(t, c.p, c.leaders)
			got, ok := PlanLeaderMove(c.p, c.peers, leaders, c.turn)
			if c.want == nil {
				if ok {
					t.Fatalf("PlanLeaderMove = %+v, want no move", got)
				}
				return
			}
			want := *c.want
			want.Target, _ = c.p.ReplicaID(want.Shard, want.To)
			if !ok || got != want {
				t.Fatalf("PlanLeaderMove = %+v, %v; want %+v", got, ok, want)
			}
		})
	}
}

// Applying the planned moves one after another evens leadership out to
// within one shard on a layout where replicas allow it, whatever the turn,
// and every move hands leadership to a replica of the shard.
func TestPlanLeaderMoveConverges(t *testing.T) {
	peers, names, _ := testPeers(5)
	p := New(1, 16, 3, KeySchemeHashTag, peers)
	for turn := range 5 {
		leaders := map[uint64]uint64{}
		for _, shard := range p.ShardIDs() {
			leaders[shard] = p.Replicas[shard][0].ID // the first by name leads
		}
		moves := 0
		for ; moves < 100; moves++ {
			mv, ok := PlanLeaderMove(p, names, leaders, turn+moves)
			if !ok {
				break
			}
			if pe, _ := p.PeerByReplica(leaders[mv.Shard]); pe.Name != mv.From {
				t.Fatalf("move %+v: shard %d is led by %s", mv, mv.Shard, pe.Name)
			}
			if r, ok := p.Replica(mv.Shard, mv.To); !ok || r.ID != mv.Target {
				t.Fatalf("move %+v: target is not %s's replica of the shard", mv, mv.To)
			}
			leaders[mv.Shard] = mv.Target
		}
		count := LeaderCounts(p, names, leaders)
		lo, hi := len(leaders), 0
		for _, c := range count {
			lo, hi = min(lo, c), max(hi, c)
		}
		if moves == 100 || hi-lo > 1 {
			t.Fatalf("turn %d: after %d moves leadership is %v", turn, moves, count)
		}
	}
}

func TestLeaderCounts(t *testing.T) {
	abc := []string{"a", "b", "c"}
	p := build(t, abc, abc, abc)
	leaders := ledBy(t, p, map[uint64]string{1: "a", 2: "a", 3: "b"})
	leaders[9] = 999 // a replica the layout does not list
	got := LeaderCounts(p, []string{"a", "c"}, leaders)
	want := map[string]int{"a": 2, "b": 1, "c": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("LeaderCounts = %v, want %v", got, want)
	}
}
