package layout

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lockmesh/lockmesh/internal/level"
)

func TestNew(t *testing.T) {
	peers, names, _ := testPeers(4)
	for _, c := range []struct {
		shards, rf, peers, wantRF int
	}{
		{16, 3, 4, 3},
		{1, 1, 1, 1},
		{4, 3, 2, 2}, // fewer peers than RF: every peer hosts every shard
		{4096, 3, 4, 3},
	} {
		in := slices.Clone(peers[:c.peers])
		slices.Reverse(in)
		p := New(7, c.shards, c.rf, KeySchemeHashTag, in)
		if err := p.validate(); err != nil {
			t.Fatalf("New(%d shards, RF %d, %d peers) is invalid: %v", c.shards, c.rf, c.peers, err)
		}
		if p.Epoch != 1 || p.ClusterID != 7 || p.KeyScheme != KeySchemeHashTag || p.Level != 0 {
			t.Fatalf("New: epoch %d cluster %d scheme %d level %d", p.Epoch, p.ClusterID, p.KeyScheme, p.Level)
		}
		if got := p.HostNames(MetaShard); len(got) != c.wantRF {
			t.Fatalf("meta shard on %v, want %d peers", got, c.wantRF)
		}
		var pn []string
		for _, pe := range p.Peers {
			pn = append(pn, pe.Name)
		}
		if !slices.Equal(pn, names[:c.peers]) {
			t.Fatalf("New lists peers %v, want %v sorted", pn, names[:c.peers])
		}
		seen := map[uint64]bool{}
		for _, shard := range p.ShardIDs() {
			hosts := p.HostNames(shard)
			if len(hosts) != c.wantRF || !slices.IsSorted(hosts) || len(slices.Compact(slices.Clone(hosts))) != len(hosts) {
				t.Fatalf("shard %d on %v, want %d distinct peers sorted", shard, hosts, c.wantRF)
			}
			for _, r := range p.Replicas[shard] {
				if seen[r.ID] || r.Join {
					t.Fatalf("shard %d: replica %+v reused an id or is marked Join", shard, r)
				}
				seen[r.ID] = true
			}
		}
		if want := uint64(len(seen) + 1); p.NextReplicaID != want {
			t.Fatalf("NextReplicaID %d, want %d", p.NextReplicaID, want)
		}
		if ids := p.ShardIDs(); len(ids) != c.shards+1 || ids[0] != MetaShard || ids[1] != FirstLockShard || ids[len(ids)-1] != FirstLockShard+uint64(c.shards)-1 {
			t.Fatalf("ShardIDs = %v... for %d shards", ids[:2], c.shards)
		}
	}
}

// Next is a deep copy one epoch on, carrying every field, the new ones
// included; changing it leaves the original alone.
func TestNextCopiesDeeply(t *testing.T) {
	p := goldenLayout()
	p.KeyScheme, p.Level = KeySchemeHashTag, 4
	before, _ := Encode(p)
	q := p.Next()
	if q.Epoch != p.Epoch+1 || q.KeyScheme != KeySchemeHashTag || q.Level != 4 {
		t.Fatalf("Next: epoch %d scheme %d level %d", q.Epoch, q.KeyScheme, q.Level)
	}
	if c := p.Clone(); !reflect.DeepEqual(c, p) {
		t.Fatalf("Clone differs: %+v", c)
	}
	q.Peers[0].Draining = true
	q.Replicas[2][0].Peer = "z"
	q.AddReplica(3, "b")
	q.AddPeer(Peer{Name: "0"})
	if after, _ := Encode(p); string(after) != string(before) {
		t.Fatal("changing the copy changed the original")
	}
}

func TestAddKeepsOrder(t *testing.T) {
	p := goldenLayout()
	r := p.AddReplica(3, "b")
	if want := (Replica{Peer: "b", ID: 8, Join: true}); r != want || p.NextReplicaID != 9 {
		t.Fatalf("AddReplica = %+v, next id %d; want %+v, 9", r, p.NextReplicaID, want)
	}
	if got := p.HostNames(3); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("shard 3 hosts %v, want sorted a b c", got)
	}
	p.AddPeer(Peer{Name: "bb"})
	p.AddPeer(Peer{Name: "0"})
	var names []string
	for _, pe := range p.Peers {
		names = append(names, pe.Name)
	}
	if !slices.Equal(names, []string{"0", "a", "b", "bb", "c"}) {
		t.Fatalf("peers %v, want sorted", names)
	}
}

func TestQueries(t *testing.T) {
	p := goldenLayout()
	if pe, ok := p.PeerByReplica(7); !ok || pe.Name != "c" {
		t.Errorf("PeerByReplica(7) = %v, %v; want c", pe, ok)
	}
	if _, ok := p.PeerByReplica(8); ok {
		t.Error("PeerByReplica(8) found a replica never given out")
	}
	for shard, rs := range p.Replicas {
		for _, r := range rs {
			if name, ok := p.ReplicaPeer(shard, r.ID); !ok || name != r.Peer {
				t.Errorf("ReplicaPeer(%d, %d) = %q, %v; want %q", shard, r.ID, name, ok, r.Peer)
			}
		}
	}
	if _, ok := p.ReplicaPeer(3, 7); ok {
		t.Error("ReplicaPeer(3, 7) found replica 7, which is shard 2's")
	}
	if id, ok := p.ReplicaID(2, "b"); !ok || id != 4 {
		t.Errorf("ReplicaID(2, b) = %d, %v; want 4", id, ok)
	}
	if p.Hosts(1, "b") || !p.Hosts(1, "c") {
		t.Error("Hosts(1, ...) wrong: b does not host the meta shard, c does")
	}
	if r, ok := p.Replica(2, "c"); !ok || !r.Join || r.ID != 7 {
		t.Errorf("Replica(2, c) = %+v, %v", r, ok)
	}
	if got := p.ReplicaCount("c"); got != 3 {
		t.Errorf("ReplicaCount(c) = %d, want 3", got)
	}
	// The joining replica is not an initial member.
	if got, want := p.InitialMembers(2), map[uint64]string{3: "nh-a", 4: "nh-b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("InitialMembers(2) = %v, want %v", got, want)
	}
	if short, fewest := p.ShortShards(); short != 0 || fewest != 2 {
		t.Errorf("ShortShards = %d, %d; want 0, 2", short, fewest)
	}
	p.RF = 3
	if short, fewest := p.ShortShards(); short != 2 || fewest != 2 {
		t.Errorf("RF 3: ShortShards = %d, %d; want 2, 2", short, fewest)
	}
}

func TestCheckIdentity(t *testing.T) {
	p := goldenLayout()
	if err := p.CheckIdentity("a", "nh-a"); err != nil {
		t.Errorf("the listed identity refused: %v", err)
	}
	if err := p.CheckIdentity("new", "nh-x"); err != nil {
		t.Errorf("a new name refused: %v", err)
	}
	err := p.CheckIdentity("b", "nh-wiped")
	if err == nil || *err != (IdentityError{Name: "b", Listed: "nh-b", Local: "nh-wiped"}) {
		t.Fatalf("CheckIdentity(b, nh-wiped) = %v", err)
	}
	if !strings.Contains(err.Error(), "wiped or replaced") {
		t.Errorf("error %q does not say why", err)
	}
}

func TestReplicaFloor(t *testing.T) {
	peers, _, _ := testPeers(5)
	p := New(1, 4, 3, KeySchemeHashTag, peers)
	p.Peers[0].Draining = true
	for _, c := range []struct {
		alive []string
		want  int
	}{
		{[]string{"peer-1", "peer-2", "peer-3", "peer-4", "peer-5"}, 3},
		{[]string{"peer-1", "peer-2"}, 2}, // draining peer-1 counts
		{[]string{"peer-5"}, 1},
		{nil, 0},
		{[]string{"stranger", "other", "third"}, 0}, // unlisted peers do not count
	} {
		alive := map[string]bool{}
		for _, name := range c.alive {
			alive[name] = true
		}
		if got := ReplicaFloor(p, alive); got != c.want {
			t.Errorf("ReplicaFloor(alive %v) = %d, want %d", c.alive, got, c.want)
		}
	}
}

func TestPlanMove(t *testing.T) {
	// Shard 2 on a, b, c (RF 3); d and e are spare.
	p := build(t, []string{"a"}, []string{"a", "b", "c"}, []string{"d", "e"})
	p.RF = 3
	all := map[string]bool{"a": true, "b": true, "c": true, "d": true, "e": true}
	without := func(dead ...string) map[string]bool {
		m := map[string]bool{}
		for k := range all {
			if !slices.Contains(dead, k) {
				m[k] = true
			}
		}
		return m
	}
	cases := []struct {
		name       string
		want       []string
		alive      map[string]bool
		floor      int
		add, drop  string
		extraOnSh2 string // a fourth replica of shard 2
	}{
		{name: "settled", want: []string{"a", "b", "c"}, alive: all, floor: 3},
		{name: "dead replica goes first, before an add", want: []string{"a", "b", "d"}, alive: without("c"), floor: 3, drop: "c"},
		{name: "a dead replica the plan keeps stays", want: []string{"a", "b", "c"}, alive: without("c"), floor: 3},
		{name: "add before removing a live one", want: []string{"a", "b", "d"}, alive: all, floor: 3, add: "d"},
		{name: "surplus removed once above floor", want: []string{"a", "b", "d"}, alive: all, floor: 3, extraOnSh2: "d", drop: "c"},
		{name: "never below the floor", want: []string{"a", "b"}, alive: all, floor: 3},
		{name: "down to the wanted count when the floor allows", want: []string{"a", "b"}, alive: all, floor: 2, drop: "c"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := p.Clone()
			if c.extraOnSh2 != "" {
				q.AddReplica(2, c.extraOnSh2)
			}
			add, remove := PlanMove(q, 2, c.want, c.alive, c.floor)
			drop := ""
			if remove != nil {
				drop = remove.Peer
				if r, _ := q.Replica(2, drop); r != *remove {
					t.Fatalf("PlanMove removes %+v, not the layout's replica %+v", *remove, r)
				}
			}
			if add != c.add || drop != c.drop {
				t.Fatalf("PlanMove = add %q, remove %q; want add %q, remove %q", add, drop, c.add, c.drop)
			}
		})
	}
}

func TestDesired(t *testing.T) {
	peers, names, _ := testPeers(5)
	p := New(1, 16, 3, KeySchemeHashTag, peers)
	for _, c := range []struct {
		name     string
		eligible []string
	}{
		{"all", names},
		{"one draining", names[1:]},
		{"two peers for RF 3", names[3:]},
		{"one peer", names[4:]},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Desired(p, c.eligible)
			rf := min(p.RF, len(c.eligible))
			count := map[string]int{}
			for _, shard := range p.ShardIDs() {
				hosts := d[shard]
				if len(hosts) != rf || len(slices.Compact(slices.Sorted(slices.Values(hosts)))) != rf {
					t.Fatalf("shard %d wants %v, want %d distinct peers", shard, hosts, rf)
				}
				for _, h := range hosts {
					if !slices.Contains(c.eligible, h) {
						t.Fatalf("shard %d wants %s, which is not eligible", shard, h)
					}
					count[h]++
				}
			}
			lo, hi := 1<<30, 0
			for _, name := range c.eligible {
				lo, hi = min(lo, count[name]), max(hi, count[name])
			}
			if hi-lo > 1 {
				t.Fatalf("replica counts %v range %d-%d", count, lo, hi)
			}
			// The order of eligible does not matter.
			rev := slices.Clone(c.eligible)
			slices.Reverse(rev)
			if d2 := Desired(p, rev); !reflect.DeepEqual(d, d2) {
				t.Fatalf("Desired depends on the order of eligible:\n%v\n%v", d, d2)
			}
			// A layout that is already where it should be stays there.
			q := p.Clone()
			for shard, hosts := range d {
				q.Replicas[shard] = nil
				for _, h := range slices.Sorted(slices.Values(hosts)) {
					q.Replicas[shard] = append(q.Replicas[shard], Replica{Peer: h, ID: 1})
				}
			}
			again := Desired(q, c.eligible)
			for shard := range d {
				if !slices.Equal(slices.Sorted(slices.Values(again[shard])), q.HostNames(shard)) {
					t.Fatalf("shard %d: a settled layout is moved again: %v -> %v", shard, q.HostNames(shard), again[shard])
				}
			}
		})
	}
	if d := Desired(p, nil); len(d) != 0 {
		t.Fatalf("Desired with no eligible peer = %v, want nothing", d)
	}
}

// A layout without a level (written before levels existed), or none at
// all, is level 1; a level past what a byte holds saturates.
func TestLevelOf(t *testing.T) {
	for _, tc := range []struct {
		p    *Placement
		want level.Level
	}{
		{nil, 1}, {&Placement{}, 1}, {&Placement{Level: 2}, 2}, {&Placement{Level: 300}, 255},
	} {
		if got := LevelOf(tc.p); got != tc.want {
			t.Errorf("LevelOf(%+v) = %d, want %d", tc.p, got, tc.want)
		}
	}
}
