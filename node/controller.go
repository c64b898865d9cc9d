package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// The controller keeps the layout in line with the live peers. It runs on
// every peer but acts only on the one whose replica leads the meta shard,
// so there is one controller per meta term. Each step it:
//
//  1. admits peers that gossip shows alive but the layout does not list;
//  2. forgets peers that are draining or dead for longer than DeadAfter
//     once they host nothing;
//  3. moves replicas toward the desired layout, one move per shard at a
//     time and a few shards at once: add the new replica (layout first,
//     then the Raft membership change), wait until it has caught up, and
//     only then remove a surplus one (moving its leadership away first),
//     so no shard ever has fewer than RF replicas;
//  4. when nothing moves, checks every few seconds that the layout lists
//     no replica Raft has removed (a layout write lost after a Raft change)
//     and drops any such replica, so the shard is repaired by step 3;
//  5. when nothing moves, evens out leadership by leader transfer.
//
// Keys never move between shards, so fencing tokens stay monotonic.
type controller struct {
	mu           sync.Mutex
	deadSince    map[string]time.Time
	newIdentity  map[string]string // name -> the other NodeHostID gossip shows for it, as last logged
	moving       map[uint64]bool
	lastTransfer time.Time // leadership moves are spaced out by transferGap
	lastSweep    time.Time // the last comparison of layout and Raft membership
	turn         int       // rotates the choice among leadership moves
}

// reconcileEvery is how often an idle controller compares the layout with
// every shard's Raft membership.
const reconcileEvery = 5 * time.Second

// maxParallelMoves bounds the shards being moved at once.
const maxParallelMoves = 4

// transferGap spaces leadership moves: each one pauses the shard's
// proposals until the new leader takes over (an RTT or two), and a target
// that is still catching up takes longer. At the default RTT of 100 ms the
// earlier 20 RTT kept a new 3-peer cluster unbalanced for 6-7 s after start
// (the quickstart's p99 of up to 240 ms was an op meeting one of those
// moves); 5 RTT settles it in 2.5-6 s, as tests with short RTTs always did.
func (n *Node) transferGap() time.Duration { return max(5*n.cfg.RTT, 500*time.Millisecond) }

func (n *Node) controlInterval() time.Duration { return max(5*n.cfg.RTT, 100*time.Millisecond) }

func (n *Node) controlLoop() {
	n.ctrl.deadSince = map[string]time.Time{}
	n.ctrl.newIdentity = map[string]string{}
	n.ctrl.moving = map[uint64]bool{}
	n.every(n.controlInterval(), func() {
		if !n.leadsShard(metaShardID) {
			return
		}
		if err := n.controlStep(); err != nil {
			n.log.Debug("controller step", "err", err)
		}
	})
}

// leadsShard reports whether this peer's replica of shard is its leader.
func (n *Node) leadsShard(shard uint64) bool { return n.replicas.Leads(shard) }

func (n *Node) controlStep() error {
	ctx, cancel := context.WithTimeout(n.ctx, n.proposalTimeout())
	defer cancel()
	p, err := n.readMetaPlacement(ctx)
	if err != nil {
		return err
	}
	now := n.now()
	members := map[string]mesh.Member{} // the alive ones, by name
	alive := map[string]bool{}
	for _, m := range n.mesh.Members() {
		if m.State != mesh.StateAlive || m.Meta.NodeHostID == "" {
			continue
		}
		if !sameIdentity(p, m) {
			// The name is back with another NodeHost: the listed peer's
			// data dir was wiped, its replicas are gone with their logs,
			// so it counts as dead and is replaced after DeadAfter. The
			// new NodeHost is admitted once the name is forgotten.
			n.noteIdentityChange(p, m)
			continue
		}
		members[m.Name] = m
		alive[m.Name] = true
	}

	// 1. Admit new peers.
	for name, m := range members {
		if _, ok := p.Peer(name); ok || m.Meta.NoReplicas || (m.Meta.Cluster != 0 && m.Meta.Cluster != p.ClusterID) {
			continue
		}
		if !speaks(m.Meta, levelOf(p)) {
			// Its replicas could not read the log (a release before
			// levels would even skip what it cannot read).
			n.log.Warn("not admitting a peer that does not speak the cluster's feature level", "peer", name,
				"speaks", fmt.Sprintf("%d to %d", m.Meta.MinVersion, m.Meta.Version), "level", levelOf(p))
			continue
		}
		q := p.Next()
		q.AddPeer(layout.Peer{Name: name, NodeHostID: m.Meta.NodeHostID})
		n.log.Info("admitting peer", "peer", name, "epoch", q.Epoch)
		return n.proposePlacement(ctx, q)
	}

	// 1b. Raise the feature level once every peer speaks a newer one.
	if raised, err := n.raiseLevel(ctx, p, n.mesh.Members()); raised || err != nil {
		return err
	}

	// 2. Track dead peers; forget the gone ones that host nothing.
	n.ctrl.mu.Lock()
	eligible := []string{}
	var forget []string
	for _, pe := range p.Peers {
		if alive[pe.Name] {
			delete(n.ctrl.deadSince, pe.Name)
		} else if _, ok := n.ctrl.deadSince[pe.Name]; !ok {
			n.ctrl.deadSince[pe.Name] = now
		}
		since, dead := n.ctrl.deadSince[pe.Name]
		expired := dead && now.Sub(since) > n.cfg.DeadAfter
		switch {
		case !pe.Draining && !expired:
			eligible = append(eligible, pe.Name)
		case p.ReplicaCount(pe.Name) == 0 && (expired || (pe.Draining && dead)):
			// A draining peer is forgotten only once it is gone, or it
			// would be admitted again as a new peer while it shuts down.
			forget = append(forget, pe.Name)
		}
	}
	n.ctrl.mu.Unlock()
	if len(forget) > 0 {
		q := p.Next()
		q.Peers = slices.DeleteFunc(q.Peers, func(pe layout.Peer) bool { return slices.Contains(forget, pe.Name) })
		n.log.Info("forgetting peers", "peers", forget, "epoch", q.Epoch)
		return n.proposePlacement(ctx, q)
	}
	if len(eligible) == 0 {
		return nil
	}

	// 3. Move replicas toward the desired layout.
	desired := layout.Desired(p, eligible)
	floor := layout.ReplicaFloor(p, alive)
	pending := false
	for _, shard := range p.ShardIDs() {
		add, remove := layout.PlanMove(p, shard, desired[shard], alive, floor)
		if add == "" && remove == nil {
			continue
		}
		pending = true
		n.ctrl.mu.Lock()
		busy := n.ctrl.moving[shard] || len(n.ctrl.moving) >= maxParallelMoves
		if !busy {
			n.ctrl.moving[shard] = true
		}
		n.ctrl.mu.Unlock()
		if busy {
			continue
		}
		n.goFunc(func() {
			defer func() {
				n.ctrl.mu.Lock()
				delete(n.ctrl.moving, shard)
				n.ctrl.mu.Unlock()
			}()
			if err := n.moveReplica(shard, add, remove); err != nil {
				n.log.Warn("replica move failed; will retry", "shard", shard, "add", add, "err", err)
			}
		})
	}
	if pending {
		n.log.Debug("controller: moves pending", "epoch", p.Epoch)
		return nil
	}
	// With nothing to move, check now and then that the layout still
	// matches Raft: a shard that lost a replica without the layout knowing
	// would never be repaired.
	n.ctrl.mu.Lock()
	sweep := time.Since(n.ctrl.lastSweep) >= reconcileEvery
	if sweep {
		n.ctrl.lastSweep = time.Now()
	}
	n.ctrl.mu.Unlock()
	if sweep {
		for _, shard := range p.ShardIDs() {
			if changed, err := n.reconcile(ctx, p, shard); changed || err != nil {
				return err
			}
		}
	}
	// 4. Even out leadership, among peers that are up: a transfer to a
	// dead replica stalls the shard's proposals for an election timeout.
	var up []string
	for _, name := range eligible {
		if alive[name] {
			up = append(up, name)
		}
	}
	n.ctrl.mu.Lock()
	recent := time.Since(n.ctrl.lastTransfer) < n.transferGap()
	n.ctrl.mu.Unlock()
	if len(up) < 2 || recent {
		return nil
	}
	return n.balanceLeaders(ctx, p, up)
}

// noteIdentityChange logs, once per NodeHostID, that gossip member m
// carries a listed name with another NodeHostID than the layout p.
func (n *Node) noteIdentityChange(p *layout.Placement, m mesh.Member) {
	pe, _ := p.Peer(m.Name)
	n.ctrl.mu.Lock()
	seen := n.ctrl.newIdentity[m.Name] == m.Meta.NodeHostID
	n.ctrl.newIdentity[m.Name] = m.Meta.NodeHostID
	n.ctrl.mu.Unlock()
	if !seen {
		n.log.Warn("peer came back with another NodeHostID (data dir wiped or replaced); replacing the old one after DeadAfter, then admitting it as a new peer",
			"name", m.Name, "layout", pe.NodeHostID, "gossip", m.Meta.NodeHostID, "dead_after", n.cfg.DeadAfter)
	}
}

// moveReplica performs one step of a shard's move.
func (n *Node) moveReplica(shard uint64, add string, remove *layout.Replica) error {
	ctx, cancel := context.WithTimeout(n.ctx, 60*time.Second)
	defer cancel()
	if add != "" {
		return n.addReplica(ctx, shard, add)
	}
	return n.removeReplica(ctx, shard, *remove)
}

func (n *Node) addReplica(ctx context.Context, shard uint64, peer string) error {
	p, err := n.readMetaPlacement(ctx)
	if err != nil {
		return err
	}
	pe, ok := p.Peer(peer)
	if !ok {
		return fmt.Errorf("peer %s left the layout", peer)
	}
	// Adding a member raises the quorum: add only while enough of the
	// others are caught up to form the larger one (all of them, for a
	// one-replica shard). A member still starting or cut off would
	// otherwise leave the shard without a quorum, and the meta shard so
	// for good: a new replica learns that it is one from the layout, which
	// the meta shard serves. The controller that began the last add may
	// have lost the meta leadership since, so this is checked, not
	// remembered.
	if err := n.checkQuorum(ctx, p, shard, peer, 1); err != nil {
		return fmt.Errorf("add replica on %s: %w", peer, err)
	}
	r, ok := p.Replica(shard, peer)
	if !ok {
		// The layout first: a replica listed but not yet a Raft member is
		// harmless (requests to it are refused and retried elsewhere); a
		// member missing from the layout would never be started.
		q := p.Next()
		r = q.AddReplica(shard, peer)
		if err := n.proposePlacement(ctx, q); err != nil {
			return err
		}
	}
	if err := n.configChange(ctx, configChangeReq{Shard: shard, Add: true, Replica: r.ID, NodeHostID: pe.NodeHostID}); err != nil {
		if errCode(err) == codeRejected {
			// The id was used and removed before: drop it from the layout,
			// the next step adds the replica under a fresh id.
			if p, rerr := n.readMetaPlacement(ctx); rerr == nil {
				q := p.Next()
				q.Replicas[shard] = slices.DeleteFunc(q.Replicas[shard], func(o layout.Replica) bool { return o.ID == r.ID })
				_ = n.proposePlacement(ctx, q)
			}
		}
		return fmt.Errorf("add replica %d on %s: %w", r.ID, peer, err)
	}
	// Wait until the new replica serves a linearizable read: it is a member
	// and has applied everything committed before the read.
	for attempt := 0; ; attempt++ {
		if m, ok := n.mesh.Member(peer); !ok || m.State != mesh.StateAlive || m.Meta.NodeHostID != pe.NodeHostID {
			return fmt.Errorf("peer %s (NodeHostID %s) went away while its replica %d of shard %d caught up", peer, pe.NodeHostID, r.ID, shard)
		}
		if err := n.caughtUp(ctx, peer, shard); err == nil {
			n.log.Info("replica added", "shard", shard, "peer", peer, "replica", r.ID)
			return nil
		}
		if err := n.backoff(ctx, min(attempt, 3)); err != nil {
			return fmt.Errorf("replica %d on %s did not catch up: %w", r.ID, peer, err)
		}
	}
}

func (n *Node) removeReplica(ctx context.Context, shard uint64, r layout.Replica) error {
	p, err := n.readMetaPlacement(ctx)
	if err != nil {
		return err
	}
	// r was chosen by counting the layout's replicas: check first that the
	// layout counts only replicas Raft still has.
	if changed, err := n.reconcile(ctx, p, shard); err != nil || changed {
		return err
	}
	// A planned removal must leave a quorum of caught-up members; a dead
	// peer's replica goes regardless (it counts toward no quorum).
	if m, ok := n.mesh.Member(r.Peer); ok && m.State == mesh.StateAlive {
		if err := n.checkQuorum(ctx, p, shard, r.Peer, -1); err != nil {
			return fmt.Errorf("remove replica %d from %s: %w", r.ID, r.Peer, err)
		}
	}
	// Never remove a leader: hand its leadership to another replica first,
	// trying the others in turn (oldest first: the most likely up to date).
	if leader, ok := n.shardLeader(ctx, p, shard); ok && leader == r.ID {
		var others []uint64
		for _, o := range p.Replicas[shard] {
			if o.ID != r.ID {
				others = append(others, o.ID)
			}
		}
		slices.Sort(others)
		moved := false
		for _, target := range others {
			_, _ = n.callPeerWith(ctx, r.Peer, methodTransferLeader, transferReq{Shard: shard, Target: target})
			deadline := time.Now().Add(30 * n.cfg.RTT)
			for !moved && time.Now().Before(deadline) {
				time.Sleep(n.cfg.RTT)
				l, ok := n.shardLeader(ctx, p, shard)
				moved = ok && l != r.ID
			}
			if moved {
				break
			}
		}
		if !moved {
			return fmt.Errorf("replica %d still leads shard %d after leadership transfers to %v", r.ID, shard, others)
		}
	}
	if err := n.configChange(ctx, configChangeReq{Shard: shard, Add: false, Replica: r.ID}); err != nil {
		return fmt.Errorf("remove replica %d from %s: %w", r.ID, r.Peer, err)
	}
	// The replica is out of the Raft group: the layout must say so before
	// anything else is planned, or the next plan counts it and removes a
	// live replica as surplus. Keep trying while the meta shard is busy
	// (its own replicas may be moving too).
	for attempt := 0; ; attempt++ {
		err := n.dropFromLayout(ctx, shard, []uint64{r.ID})
		if err == nil {
			n.log.Info("replica removed from layout", "shard", shard, "peer", r.Peer, "replica", r.ID)
			return nil
		}
		if berr := n.backoff(ctx, min(attempt, 3)); berr != nil {
			return fmt.Errorf("replica %d left shard %d but the layout still lists it: %w", r.ID, shard, err)
		}
	}
}

// checkQuorum checks that shard's replicas other than peer's, as many as
// are caught up (they serve a linearizable read), form a quorum of the
// membership after adding (delta 1) or removing (delta -1) peer's
// replica; a shard of one replica adds its second only while that one is.
func (n *Node) checkQuorum(ctx context.Context, p *layout.Placement, shard uint64, peer string, delta int) error {
	var others []string
	for _, r := range p.Replicas[shard] {
		if r.Peer != peer {
			others = append(others, r.Peer)
		}
	}
	size := len(others)
	if delta > 0 {
		size++
	}
	need := min(size/2+1, len(others))
	caughtUp := 0
	var lagging []string
	for _, name := range others {
		if caughtUp >= need {
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
		err := n.caughtUp(cctx, name, shard)
		cancel()
		if err == nil {
			caughtUp++
		} else {
			lagging = append(lagging, name)
		}
	}
	if caughtUp >= need {
		return nil
	}
	return fmt.Errorf("shard %d would have %d members but only %d of the others are caught up (%v lag), not a quorum; waiting", shard, size, caughtUp, lagging)
}

// dropFromLayout removes the replicas ids of shard from the layout.
func (n *Node) dropFromLayout(ctx context.Context, shard uint64, ids []uint64) error {
	p, err := n.readMetaPlacement(ctx)
	if err != nil {
		return err
	}
	listed := func(o layout.Replica) bool { return slices.Contains(ids, o.ID) }
	if !slices.ContainsFunc(p.Replicas[shard], listed) {
		return nil
	}
	q := p.Next()
	q.Replicas[shard] = slices.DeleteFunc(q.Replicas[shard], listed)
	return n.proposePlacement(ctx, q)
}

// reconcile makes the layout of shard agree with its Raft membership:
// replicas the layout lists but Raft removed (a controller that lost its
// meta leadership, or a layout write lost after the Raft change) are
// dropped from the layout. It reports whether it changed anything. The
// layout is what the controller plans from, so a replica counted there but
// gone from Raft would hide an under-replicated shard, or make a live
// replica look surplus.
func (n *Node) reconcile(ctx context.Context, p *layout.Placement, shard uint64) (bool, error) {
	m, err := n.membership(ctx, shard)
	if err != nil {
		return false, err
	}
	var gone []uint64
	for _, r := range p.Replicas[shard] {
		if slices.Contains(m.Removed, r.ID) {
			gone = append(gone, r.ID)
		}
	}
	if len(gone) == 0 {
		return false, nil
	}
	if err := n.dropFromLayout(ctx, shard, gone); err != nil {
		return false, err
	}
	n.log.Warn("layout listed replicas Raft had removed; dropped them", "shard", shard, "replicas", gone)
	return true, nil
}

// balanceLeaders asks eligible peers which shards they lead and makes the
// one leadership transfer layout.PlanLeaderMove picks, if any.
func (n *Node) balanceLeaders(ctx context.Context, p *layout.Placement, eligible []string) error {
	leaders := map[uint64]uint64{}
	for _, name := range eligible {
		st, err := n.peerStatus(ctx, name)
		if err != nil {
			continue
		}
		for _, l := range st.Leading {
			leaders[l] = st.Replicas[l]
		}
	}
	// A new turn each round: a transfer that does not take (a target still
	// catching up) is not retried forever while other shards could move.
	n.ctrl.mu.Lock()
	n.ctrl.turn++
	turn := n.ctrl.turn
	n.ctrl.mu.Unlock()
	mv, ok := layout.PlanLeaderMove(p, eligible, leaders, turn)
	if !ok {
		n.log.Debug("controller: leadership balanced", "leaders", layout.LeaderCounts(p, eligible, leaders), "known", len(leaders))
		return nil
	}
	n.log.Debug("moving leadership", "shard", mv.Shard, "from", mv.From, "to", mv.To)
	n.ctrl.mu.Lock()
	n.ctrl.lastTransfer = time.Now()
	n.ctrl.mu.Unlock()
	_, err := n.callPeerWith(ctx, mv.From, methodTransferLeader, transferReq{Shard: mv.Shard, Target: mv.Target})
	return err
}

// shardLeader asks the shard's hosts who leads it.
func (n *Node) shardLeader(ctx context.Context, p *layout.Placement, shard uint64) (uint64, bool) {
	for _, name := range p.HostNames(shard) {
		if st, err := n.peerStatus(ctx, name); err == nil {
			if id, ok := st.Leaders[shard]; ok && id != 0 {
				return id, true
			}
		}
	}
	return 0, false
}

// peerStatus asks the named peer which replicas it runs and who leads
// their shards as it sees them.
func (n *Node) peerStatus(ctx context.Context, name string) (statusResp, error) {
	var st statusResp
	raw, err := n.callPeerName(ctx, name, methodStatus, nil)
	if err == nil {
		err = decodeBody(raw, &st)
	}
	return st, err
}

// caughtUp asks peer whether its replica of shard serves a linearizable
// read: it is a member and has applied everything committed before it.
func (n *Node) caughtUp(ctx context.Context, peer string, shard uint64) error {
	_, err := n.callPeerWith(ctx, peer, methodCaughtUp, shardReq{Shard: shard})
	return err
}
