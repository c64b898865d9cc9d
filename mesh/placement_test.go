package mesh

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func peerNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("peer-%d", i+1)
	}
	return out
}

func TestReplicasDeterministicAndOrderIndependent(t *testing.T) {
	peers := peerNames(7)
	rng := rand.New(rand.NewPCG(1, 2))
	for shard := uint64(0); shard < 64; shard++ {
		want := Replicas(shard, peers, 3)
		if len(want) != 3 {
			t.Fatalf("shard %d: got %d replicas, want 3", shard, len(want))
		}
		shuffled := slices.Clone(peers)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		withDups := append(slices.Clone(shuffled), shuffled[:3]...)
		for _, in := range [][]string{peers, shuffled, withDups} {
			if got := Replicas(shard, in, 3); !slices.Equal(got, want) {
				t.Fatalf("shard %d: Replicas(%v) = %v, want %v", shard, in, got, want)
			}
		}
		if !slices.Equal(peers, peerNames(7)) {
			t.Fatal("Replicas modified its input")
		}
	}
}

func TestReplicasCapsRF(t *testing.T) {
	peers := peerNames(3)
	got := Replicas(5, peers, 10)
	if len(got) != 3 {
		t.Fatalf("rf 10 over 3 peers: got %v, want all 3", got)
	}
	slices.Sort(got)
	if !slices.Equal(got, peers) {
		t.Fatalf("rf 10 over 3 peers: got %v, want %v", got, peers)
	}
	if got := Replicas(5, []string{"a", "a", "b"}, 5); len(got) != 2 {
		t.Fatalf("duplicates counted: %v", got)
	}
	if got := Replicas(5, peers, 0); got != nil {
		t.Fatalf("rf 0: got %v, want nil", got)
	}
	if got := Replicas(5, nil, 3); got != nil {
		t.Fatalf("no peers: got %v, want nil", got)
	}
	// The prefix property: a smaller rf is a prefix of a larger one.
	if a, b := Replicas(9, peerNames(6), 2), Replicas(9, peerNames(6), 4); !slices.Equal(a, b[:2]) {
		t.Fatalf("rf 2 %v is not a prefix of rf 4 %v", a, b)
	}
}

func countLoad(shards int, peers []string, rf int) map[string]int {
	load := make(map[string]int)
	for s := 1; s <= shards; s++ {
		for _, p := range Replicas(uint64(s), peers, rf) {
			load[p]++
		}
	}
	return load
}

func TestReplicasSpreadEvenly(t *testing.T) {
	// The deployment default: 16 lock shards (ids 1..16), RF 3, 5 peers.
	for _, peers := range [][]string{
		peerNames(5),
		{"api-1", "api-2", "api-3", "api-4", "api-5"},
		{"10.0.0.5:7946", "10.0.0.6:7946", "10.0.0.7:7946", "10.0.0.8:7946", "10.0.0.9:7946"},
	} {
		load := countLoad(16, peers, 3)
		for _, p := range peers {
			if load[p] < 6 || load[p] > 14 {
				t.Errorf("16 shards rf 3 over %v: %s hosts %d replicas, want 6..14 (load %v)", peers, p, load[p], load)
			}
		}
	}
	// Many shards: every peer within 10% of the mean.
	peers := peerNames(5)
	load := countLoad(3000, peers, 3)
	mean := 3000 * 3 / len(peers)
	for _, p := range peers {
		if d := load[p] - mean; d < -mean/10 || d > mean/10 {
			t.Errorf("3000 shards: %s hosts %d replicas, mean %d (load %v)", p, load[p], mean, load)
		}
	}
}

func TestReplicasMinimalMovement(t *testing.T) {
	before := peerNames(5)
	after := append(slices.Clone(before), "peer-new")
	moved := 0
	for s := uint64(0); s < 500; s++ {
		old, cur := Replicas(s, before, 3), Replicas(s, after, 3)
		if !slices.Contains(cur, "peer-new") {
			if !slices.Equal(old, cur) {
				t.Fatalf("shard %d: replicas changed %v -> %v without the new peer", s, old, cur)
			}
			continue
		}
		moved++
		// The new peer displaces exactly the lowest-weighted old replica.
		rest := slices.DeleteFunc(slices.Clone(cur), func(p string) bool { return p == "peer-new" })
		if !slices.Equal(rest, old[:2]) {
			t.Fatalf("shard %d: %v -> %v moved more than one replica", s, old, cur)
		}
	}
	// Expect about rf/(n+1) = 1/2 of shards to take the new peer.
	if moved < 200 || moved > 300 {
		t.Fatalf("new peer joined %d of 500 shards, want about 250", moved)
	}
	// Removing a peer only touches the shards it hosted.
	for s := uint64(0); s < 500; s++ {
		old, cur := Replicas(s, before, 3), Replicas(s, before[1:], 3)
		if !slices.Contains(old, before[0]) && !slices.Equal(old, cur) {
			t.Fatalf("shard %d: removing %s changed %v -> %v", s, before[0], old, cur)
		}
	}
}
