package layout

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// settle runs the controller's planning (Desired, ReplicaFloor, PlanMove)
// on p until nothing moves, applying each move at once as the controller
// would once it succeeds. It fails t if a removal of a live replica takes
// a shard below RF, and returns the settled layout.
func settle(t *testing.T, p *Placement, eligible []string, alive map[string]bool) *Placement {
	t.Helper()
	for step := 0; step < 1000; step++ {
		desired := Desired(p, eligible)
		floor := ReplicaFloor(p, alive)
		moved := false
		for _, shard := range p.ShardIDs() {
			add, remove := PlanMove(p, shard, desired[shard], alive, floor)
			switch {
			case add != "":
				q := p.Next()
				q.AddReplica(shard, add)
				p, moved = q, true
			case remove != nil:
				if alive[remove.Peer] && len(p.Replicas[shard])-1 < p.RF {
					t.Fatalf("shard %d: planned removal of live replica %v leaves %d replicas, RF %d; layout %s",
						shard, *remove, len(p.Replicas[shard])-1, p.RF, describe(p))
				}
				q := p.Next()
				q.Replicas[shard] = slices.DeleteFunc(q.Replicas[shard], func(r Replica) bool { return r.ID == remove.ID })
				p, moved = q, true
			}
		}
		if !moved {
			return p
		}
	}
	t.Fatalf("the plan did not settle in 1000 steps: %s", describe(p))
	return nil
}

// describe is the layout as "shard[peers]" for messages.
func describe(p *Placement) string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d:", p.Epoch)
	for _, shard := range p.ShardIDs() {
		fmt.Fprintf(&b, " %d%v", shard, p.HostNames(shard))
	}
	return b.String()
}

// testPeers returns n peers "peer-1".."peer-n", their names, and the set
// of them as alive.
func testPeers(n int) ([]Peer, []string, map[string]bool) {
	var peers []Peer
	var names []string
	alive := map[string]bool{}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("peer-%d", i)
		peers = append(peers, Peer{Name: name, NodeHostID: "nh-" + name})
		names = append(names, name)
		alive[name] = true
	}
	return peers, names, alive
}

// A draining peer's replicas leave only as fast as other peers take them:
// a planned change never takes a shard below RF (issue 11: Leave on a
// 3-peer RF-3 cluster left most shards with 2 replicas).
func TestPlanKeepsReplicationFactorWhileDraining(t *testing.T) {
	cases := []struct {
		peers, rf, draining int
		wantDrained         bool // the draining peers end with no replica
	}{
		{peers: 3, rf: 3, draining: 1, wantDrained: false},
		{peers: 4, rf: 3, draining: 1, wantDrained: true},
		{peers: 5, rf: 3, draining: 2, wantDrained: true},
		{peers: 5, rf: 3, draining: 3, wantDrained: false},
		{peers: 3, rf: 1, draining: 1, wantDrained: true},
		{peers: 2, rf: 1, draining: 1, wantDrained: true},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d-peers-rf%d-%d-draining", c.peers, c.rf, c.draining), func(t *testing.T) {
			peers, names, alive := testPeers(c.peers)
			p := New(1, 16, c.rf, KeySchemeHashTag, peers)
			for i := range c.draining {
				p.Peers[i].Draining = true
			}
			eligible := names[c.draining:]
			p = settle(t, p, eligible, alive)
			for _, shard := range p.ShardIDs() {
				if got := len(p.Replicas[shard]); got < c.rf {
					t.Errorf("shard %d has %d replicas, RF %d: %s", shard, got, c.rf, describe(p))
				}
			}
			drained := true
			for _, name := range names[:c.draining] {
				if p.ReplicaCount(name) > 0 {
					drained = false
				}
			}
			if drained != c.wantDrained {
				t.Errorf("draining peers drained: %v, want %v: %s", drained, c.wantDrained, describe(p))
			}
		})
	}
}

// A dead peer is the one way below RF: its replicas are removed (and
// replaced where another peer can take them).
func TestPlanReplacesDeadPeer(t *testing.T) {
	peers, names, alive := testPeers(3)
	p := New(1, 8, 3, KeySchemeHashTag, peers)
	delete(alive, "peer-1") // dead past DeadAfter: no longer eligible
	p = settle(t, p, names[1:], alive)
	if n := p.ReplicaCount("peer-1"); n != 0 {
		t.Fatalf("dead peer still has %d replicas: %s", n, describe(p))
	}
	for _, shard := range p.ShardIDs() {
		if got := len(p.Replicas[shard]); got != 2 {
			t.Errorf("shard %d has %d replicas, want 2 (the live peers): %s", shard, got, describe(p))
		}
	}
}

// With more peers than RF the plan spreads replicas evenly, and a new peer
// takes its share.
func TestPlanBalancesNewPeer(t *testing.T) {
	peers, names, alive := testPeers(5)
	p := New(1, 16, 3, KeySchemeHashTag, peers[:3])
	p.Peers = peers
	p = settle(t, p, names, alive)
	lo, hi := 1<<30, 0
	for _, name := range names {
		c := p.ReplicaCount(name)
		lo, hi = min(lo, c), max(hi, c)
	}
	if hi-lo > 1 {
		t.Fatalf("replica counts range %d-%d: %s", lo, hi, describe(p))
	}
}
