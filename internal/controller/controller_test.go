package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/membership"
	"github.com/lockmesh/lockmesh/mesh"
)

// fakeCluster is a meta shard, a gossip view and peers in memory: the layout
// is replaced only by its successor, as the meta shard's state machine
// does, and every call is recorded.
type fakeCluster struct {
	mu        sync.Mutex
	p         *layout.Placement
	members   []mesh.Member
	lagging   map[string]bool // peers whose replicas are not caught up
	status    map[string]membership.PeerStatus
	removed   map[uint64][]uint64 // shard -> ids Raft removed
	refuseIDs map[uint64]bool     // ids a membership add is refused for
	changes   []membership.MembershipChange
	transfers []string        // "peer shard->target"
	impostors map[string]bool // members that cannot vouch for their identity
}

func (h *fakeCluster) LeadsMeta() bool { return true }

func (h *fakeCluster) Vouch(_ context.Context, m mesh.Member) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.impostors[m.Name] {
		return errors.New("certificate does not name " + m.Name)
	}
	return nil
}

func (h *fakeCluster) ReadPlacement(context.Context) (*layout.Placement, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.p.Clone(), nil
}

func (h *fakeCluster) ProposePlacement(_ context.Context, q *layout.Placement) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if q.Epoch != h.p.Epoch+1 {
		return fmt.Errorf("epoch %d is not the successor of %d", q.Epoch, h.p.Epoch)
	}
	h.p = q.Clone()
	return nil
}

func (h *fakeCluster) placement() *layout.Placement {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.p.Clone()
}

func (h *fakeCluster) Members() []mesh.Member { return slices.Clone(h.members) }

func (h *fakeCluster) Member(name string) (mesh.Member, bool) {
	for _, m := range h.members {
		if m.Name == name {
			return m, true
		}
	}
	return mesh.Member{}, false
}

func (h *fakeCluster) Status(_ context.Context, peer string) (membership.PeerStatus, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.status[peer]
	if !ok {
		return membership.PeerStatus{}, fmt.Errorf("peer %s does not answer", peer)
	}
	return st, nil
}

func (h *fakeCluster) CaughtUp(_ context.Context, peer string, shard uint64) error {
	if h.lagging[peer] {
		return fmt.Errorf("peer %s: shard %d not caught up", peer, shard)
	}
	return nil
}

func (h *fakeCluster) ChangeMembership(_ context.Context, c membership.MembershipChange) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.Add && h.refuseIDs[c.Replica] {
		return fmt.Errorf("%w: id %d", membership.ErrReplicaRemoved, c.Replica)
	}
	h.changes = append(h.changes, c)
	return nil
}

func (h *fakeCluster) Membership(_ context.Context, shard uint64) (membership.Membership, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return membership.Membership{Removed: h.removed[shard]}, nil
}

func (h *fakeCluster) TransferLeader(_ context.Context, peer string, shard, target uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.transfers = append(h.transfers, fmt.Sprintf("%s %d->%d", peer, shard, target))
	// The transfer takes: every peer now sees target leading.
	for name, st := range h.status {
		st.Leaders = map[uint64]uint64{shard: target}
		h.status[name] = st
	}
	return nil
}

func (h *fakeCluster) Backoff(ctx context.Context, _ int) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Millisecond):
		return nil
	}
}

func alive(name, nhid string, version level.Level) mesh.Member {
	return mesh.Member{Name: name, State: mesh.StateAlive,
		Meta: mesh.Meta{NodeHostID: nhid, MinLevel: 1, MaxLevel: version}}
}

// threePeers is a layout of 1 lock shard on peers a, b and c at level 1,
// and a fake host whose gossip sees them alive.
func threePeers() *fakeCluster {
	peers := []layout.Peer{{Name: "a", NodeHostID: "id-a"}, {Name: "b", NodeHostID: "id-b"}, {Name: "c", NodeHostID: "id-c"}}
	p := layout.New(7, 1, 3, layout.KeySchemeHashTag, peers)
	p.Level = 1
	return &fakeCluster{
		p:       p,
		members: []mesh.Member{alive("a", "id-a", 1), alive("b", "id-b", 1), alive("c", "id-c", 1)},
		lagging: map[string]bool{},
		status:  map[string]membership.PeerStatus{},
		removed: map[uint64][]uint64{},
	}
}

func newTestController(h Cluster) *Controller {
	return New(h, Config{Interval: time.Millisecond, RTT: time.Millisecond,
		ProposalTimeout: time.Second, DeadAfter: time.Minute, TopLevel: 2})
}

func TestSortPeers(t *testing.T) {
	p := layout.New(7, 1, 1, layout.KeySchemeHashTag, []layout.Peer{
		{Name: "up"}, {Name: "gone-briefly"}, {Name: "gone-long"}, {Name: "gone-long-empty"},
		{Name: "draining-up"}, {Name: "draining-gone"}})
	p.Replicas = map[uint64][]layout.Replica{2: {{ID: 1, Peer: "gone-long"}, {ID: 2, Peer: "draining-gone"}}}
	for i := range p.Peers {
		p.Peers[i].Draining = p.Peers[i].Name == "draining-up" || p.Peers[i].Name == "draining-gone"
	}
	t0 := time.Unix(1000, 0)
	dead := map[string]time.Time{"up": t0, "gone-long": t0, "gone-long-empty": t0, "draining-gone": t0}
	now := t0.Add(2 * time.Minute)
	live := map[string]bool{"up": true, "draining-up": true}
	// The layout keeps its peers sorted by name, and so do the lists.
	eligible, forget := sortPeers(p, live, dead, now, time.Minute)
	if want := []string{"gone-briefly", "up"}; !slices.Equal(eligible, want) {
		t.Errorf("eligible = %v, want %v", eligible, want)
	}
	// gone-long still hosts a replica and draining-gone too: they are
	// replaced first, forgotten later.
	if want := []string{"gone-long-empty"}; !slices.Equal(forget, want) {
		t.Errorf("forget = %v, want %v", forget, want)
	}
	if _, ok := dead["up"]; ok {
		t.Error("a peer alive again is still timed as dead")
	}
	if !dead["gone-briefly"].Equal(now) {
		t.Errorf("a peer first seen gone is timed from %v, want now", dead["gone-briefly"])
	}
	p.Replicas = nil
	_, forget = sortPeers(p, live, dead, now, time.Minute)
	if want := []string{"draining-gone", "gone-long", "gone-long-empty"}; !slices.Equal(forget, want) {
		t.Errorf("with no replicas, forget = %v, want %v (never a draining peer still up)", forget, want)
	}
}

func TestQuorumNeed(t *testing.T) {
	p := layout.New(7, 1, 3, layout.KeySchemeHashTag, []layout.Peer{{Name: "a"}, {Name: "b"}, {Name: "c"}})
	shard := p.ShardIDs()[1]
	for _, c := range []struct {
		peer             string
		delta            int
		size, need, rest int
	}{
		{"d", 1, 4, 3, 3},  // 3 -> 4 members: all 3 others
		{"c", -1, 2, 2, 2}, // 3 -> 2 members: both others
		{"d", -1, 3, 2, 3}, // a peer not hosting it: unchanged membership
	} {
		others, size, need := quorumNeed(p, shard, c.peer, c.delta)
		if size != c.size || need != c.need || len(others) != c.rest {
			t.Errorf("quorumNeed(%s, %+d) = %v, %d, %d; want %d others, size %d, need %d", c.peer, c.delta, others, size, need, c.rest, c.size, c.need)
		}
	}
	one := layout.New(7, 1, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a"}})
	if _, size, need := quorumNeed(one, shard, "b", 1); size != 2 || need != 1 {
		t.Errorf("second replica of a one-replica shard: size %d need %d, want 2 and 1 (its one replica caught up)", size, need)
	}
}

func TestCheckQuorum(t *testing.T) {
	h := threePeers()
	c := newTestController(h)
	ctx := context.Background()
	p := h.placement()
	shard := p.ShardIDs()[1]
	if err := c.CheckQuorum(ctx, p, shard, "d", 1); err != nil {
		t.Fatalf("all caught up, adding: %v", err)
	}
	h.lagging["c"] = true
	if err := c.CheckQuorum(ctx, p, shard, "d", 1); err == nil {
		t.Error("adding a 4th member with one of 3 lagging was allowed")
	}
	if err := c.CheckQuorum(ctx, p, shard, "c", -1); err != nil {
		t.Errorf("removing the lagging member: %v", err)
	}
	if err := c.CheckQuorum(ctx, p, shard, "b", -1); err == nil {
		t.Error("removing a live member, leaving 1 caught up of 2, was allowed")
	}
}

func TestStepAdmitsAPeerOnlyIfItMayJoin(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		m      mesh.Member
		admits bool
	}{
		{"new peer", alive("d", "id-d", 2), true},
		{"no replicas", func() mesh.Member { m := alive("d", "id-d", 2); m.Meta.NoReplicas = true; return m }(), false},
		{"another cluster", func() mesh.Member { m := alive("d", "id-d", 2); m.Meta.Cluster = 99; return m }(), false},
		{"does not speak the level", func() mesh.Member { m := alive("d", "id-d", 3); m.Meta.MinLevel = 3; return m }(), false},
		{"listed name, other NodeHost", alive("c", "id-wiped", 2), false},
		{"cannot vouch for its identity", alive("impostor", "id-i", 2), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := threePeers()
			h.impostors = map[string]bool{"impostor": true}
			h.members = append(h.members[:2], c.m)
			if c.m.Name != "c" {
				h.members = append(h.members, alive("c", "id-c", 1))
			}
			before := h.placement()
			_ = newTestController(h).step(ctx)
			after := h.placement()
			_, listed := after.Peer(c.m.Name)
			if c.m.Name == "c" {
				_, listed = after.Peer("d")
			}
			if listed != c.admits {
				t.Fatalf("admitted = %v, want %v", listed, c.admits)
			}
			if pe, _ := after.Peer("c"); pe.NodeHostID != "id-c" {
				t.Fatalf("the layout's peer c changed identity to %s", pe.NodeHostID)
			}
			if c.admits && after.Epoch != before.Epoch+1 {
				t.Fatalf("admission wrote epoch %d after %d", after.Epoch, before.Epoch)
			}
		})
	}
}

func TestRaiseLevel(t *testing.T) {
	ctx := context.Background()
	upgraded := func() *fakeCluster {
		h := threePeers()
		for i := range h.members {
			h.members[i].Meta.MaxLevel = 2
			h.status[h.members[i].Name] = membership.PeerStatus{Level: 2}
		}
		return h
	}
	h := upgraded()
	if raised, err := newTestController(h).raiseLevel(ctx, h.placement(), h.Members()); !raised || err != nil || layout.LevelOf(h.placement()) != 2 {
		t.Fatalf("every peer speaks 2: raised %v, err %v, level %d", raised, err, layout.LevelOf(h.placement()))
	}
	h = upgraded()
	h.members[2].State = mesh.StateDead // may come back as an old release
	if raised, _ := newTestController(h).raiseLevel(ctx, h.placement(), h.Members()); raised {
		t.Fatal("raised while a peer of the layout was not seen alive")
	}
	h = upgraded()
	h.status["b"] = membership.PeerStatus{Level: 0} // restarted on a release before levels
	if raised, _ := newTestController(h).raiseLevel(ctx, h.placement(), h.Members()); raised {
		t.Fatal("raised while a peer said it speaks level 1 only")
	}
	h = upgraded()
	delete(h.status, "a")
	if raised, _ := newTestController(h).raiseLevel(ctx, h.placement(), h.Members()); raised {
		t.Fatal("raised without hearing from every peer of the layout")
	}
	h = upgraded()
	if raised, _ := New(h, Config{TopLevel: 1}).raiseLevel(ctx, h.placement(), h.Members()); raised {
		t.Fatal("raised above the level this peer speaks")
	}
}

func TestAddReplicaOfARemovedIDDropsIt(t *testing.T) {
	h := threePeers()
	h.p.AddPeer(layout.Peer{Name: "d", NodeHostID: "id-d"})
	h.members = append(h.members, alive("d", "id-d", 1))
	shard := h.p.ShardIDs()[1]
	r := h.p.AddReplica(shard, "d")
	h.refuseIDs = map[uint64]bool{r.ID: true}
	c := newTestController(h)
	if err := c.addReplica(context.Background(), shard, "d"); !errors.Is(err, membership.ErrReplicaRemoved) {
		t.Fatalf("add of a removed id: %v", err)
	}
	if _, ok := h.placement().Replica(shard, "d"); ok {
		t.Fatal("the layout still lists the removed id; the next add would reuse it")
	}
}

func TestAddReplicaWaitsForQuorum(t *testing.T) {
	h := threePeers()
	h.p.AddPeer(layout.Peer{Name: "d", NodeHostID: "id-d"})
	h.members = append(h.members, alive("d", "id-d", 1))
	h.lagging["b"] = true
	shard := h.p.ShardIDs()[1]
	if err := newTestController(h).addReplica(context.Background(), shard, "d"); err == nil {
		t.Fatal("added a 4th member with one of 3 lagging")
	}
	if len(h.changes) != 0 {
		t.Fatalf("membership changed without a quorum: %v", h.changes)
	}
	if _, ok := h.placement().Replica(shard, "d"); ok {
		t.Fatal("the layout lists a replica added without a quorum")
	}
}

func TestRemoveReplicaMovesLeadershipFirst(t *testing.T) {
	h := threePeers()
	shard := h.p.ShardIDs()[1]
	rc, _ := h.p.Replica(shard, "c")
	for _, name := range []string{"a", "b", "c"} {
		h.status[name] = membership.PeerStatus{Leaders: map[uint64]uint64{shard: rc.ID}}
	}
	if err := newTestController(h).removeReplica(context.Background(), shard, rc); err != nil {
		t.Fatal(err)
	}
	if len(h.transfers) == 0 {
		t.Fatal("the leader's replica was removed without moving its leadership")
	}
	if want := (membership.MembershipChange{Shard: shard, Replica: rc.ID}); len(h.changes) != 1 || h.changes[0] != want {
		t.Fatalf("membership changes %v, want %v", h.changes, want)
	}
	if _, ok := h.placement().Replica(shard, "c"); ok {
		t.Fatal("the layout still lists the removed replica")
	}
}

func TestReconcileDropsReplicasRaftRemoved(t *testing.T) {
	h := threePeers()
	shard := h.p.ShardIDs()[1]
	rb, _ := h.p.Replica(shard, "b")
	h.removed[shard] = []uint64{rb.ID}
	changed, err := newTestController(h).reconcile(context.Background(), h.placement(), shard)
	if err != nil || !changed {
		t.Fatalf("reconcile: changed %v, err %v", changed, err)
	}
	if _, ok := h.placement().Replica(shard, "b"); ok {
		t.Fatal("the layout still lists a replica Raft removed")
	}
	if changed, err := newTestController(h).reconcile(context.Background(), h.placement(), shard); changed || err != nil {
		t.Fatalf("second reconcile: changed %v, err %v", changed, err)
	}
}

// TestRunStopsWithItsMoves checks that Run returns, moves included, once
// its context ends (goleak in TestMain sees any left behind).
func TestRunStopsWithItsMoves(t *testing.T) {
	h := threePeers()
	h.p.AddPeer(layout.Peer{Name: "d", NodeHostID: "id-d"})
	h.p.RF = 4
	h.members = append(h.members, alive("d", "id-d", 1))
	h.lagging["d"] = true // the add waits for d to catch up, until ctx ends
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c := newTestController(h)
	go func() { c.Run(ctx); close(done) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.mu.Lock()
		n := len(h.changes)
		h.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the controller never added d's replica")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
