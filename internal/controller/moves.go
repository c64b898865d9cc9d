package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/bootstrap"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/membership"
	"github.com/lockmesh/lockmesh/mesh"
)

// moveReplica performs one step of a shard's move: add a replica on peer
// add, or remove replica remove.
func (c *Controller) moveReplica(ctx context.Context, shard uint64, add string, remove *layout.Replica) error {
	ctx, cancel := context.WithTimeout(ctx, moveTimeout)
	defer cancel()
	if add != "" {
		return c.addReplica(ctx, shard, add)
	}
	return c.removeReplica(ctx, shard, *remove)
}

func (c *Controller) addReplica(ctx context.Context, shard uint64, peer string) error {
	p, err := c.cluster.ReadPlacement(ctx)
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
	if err := c.CheckQuorum(ctx, p, shard, peer, 1); err != nil {
		return fmt.Errorf("add replica on %s: %w", peer, err)
	}
	r, ok := p.Replica(shard, peer)
	if !ok {
		// The layout first: a replica listed but not yet a Raft member is
		// harmless (requests to it are refused and retried elsewhere); a
		// member missing from the layout would never be started.
		q := p.Next()
		r = q.AddReplica(shard, peer)
		if err := c.cluster.ProposePlacement(ctx, q); err != nil {
			return err
		}
	}
	if err := c.cluster.ChangeMembership(ctx, membership.MembershipChange{Shard: shard, Add: true, Replica: r.ID, NodeHostID: pe.NodeHostID}); err != nil {
		if errors.Is(err, membership.ErrReplicaRemoved) {
			// The id was used and removed before: drop it from the layout,
			// the next step adds the replica under a fresh id.
			if p, rerr := c.cluster.ReadPlacement(ctx); rerr == nil {
				q := p.Next()
				q.Replicas[shard] = slices.DeleteFunc(q.Replicas[shard], func(o layout.Replica) bool { return o.ID == r.ID })
				_ = c.cluster.ProposePlacement(ctx, q)
			}
		}
		return fmt.Errorf("add replica %d on %s: %w", r.ID, peer, err)
	}
	// Wait until the new replica serves a linearizable read: it is a member
	// and has applied everything committed before the read.
	for attempt := 0; ; attempt++ {
		if m, ok := c.cluster.Member(peer); !ok || m.State != mesh.StateAlive || m.Meta.NodeHostID != pe.NodeHostID {
			return fmt.Errorf("peer %s (NodeHostID %s) went away while its replica %d of shard %d caught up", peer, pe.NodeHostID, r.ID, shard)
		}
		if err := c.cluster.CaughtUp(ctx, peer, shard); err == nil {
			c.log.Info("replica added", "shard", shard, "peer", peer, "replica", r.ID)
			return nil
		}
		if err := c.cluster.Backoff(ctx, min(attempt, 3)); err != nil {
			return fmt.Errorf("replica %d on %s did not catch up: %w", r.ID, peer, err)
		}
	}
}

func (c *Controller) removeReplica(ctx context.Context, shard uint64, r layout.Replica) error {
	p, err := c.cluster.ReadPlacement(ctx)
	if err != nil {
		return err
	}
	// r was chosen by counting the layout's replicas: check first that the
	// layout counts only replicas Raft still has.
	if changed, err := c.reconcile(ctx, p, shard); err != nil || changed {
		return err
	}
	// A planned removal must leave a quorum of caught-up members; a dead
	// peer's replica goes regardless (it counts toward no quorum).
	if m, ok := c.cluster.Member(r.Peer); ok && m.State == mesh.StateAlive {
		if err := c.CheckQuorum(ctx, p, shard, r.Peer, -1); err != nil {
			return fmt.Errorf("remove replica %d from %s: %w", r.ID, r.Peer, err)
		}
	}
	// Never remove a leader: hand its leadership to another replica first,
	// trying the others in turn (oldest first: the most likely up to date).
	if leader, ok := c.shardLeader(ctx, p, shard); ok && leader == r.ID {
		var others []uint64
		for _, o := range p.Replicas[shard] {
			if o.ID != r.ID {
				others = append(others, o.ID)
			}
		}
		slices.Sort(others)
		moved := false
		for _, target := range others {
			_ = c.cluster.TransferLeader(ctx, r.Peer, shard, target)
			deadline := time.Now().Add(30 * c.cfg.RTT)
			for !moved && time.Now().Before(deadline) {
				time.Sleep(c.cfg.RTT)
				l, ok := c.shardLeader(ctx, p, shard)
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
	if err := c.cluster.ChangeMembership(ctx, membership.MembershipChange{Shard: shard, Add: false, Replica: r.ID}); err != nil {
		return fmt.Errorf("remove replica %d from %s: %w", r.ID, r.Peer, err)
	}
	// The replica is out of the Raft group: the layout must say so before
	// anything else is planned, or the next plan counts it and removes a
	// live replica as surplus. Keep trying while the meta shard is busy
	// (its own replicas may be moving too).
	for attempt := 0; ; attempt++ {
		err := c.dropFromLayout(ctx, shard, []uint64{r.ID})
		if err == nil {
			c.log.Info("replica removed from layout", "shard", shard, "peer", r.Peer, "replica", r.ID)
			return nil
		}
		if berr := c.cluster.Backoff(ctx, min(attempt, 3)); berr != nil {
			return fmt.Errorf("replica %d left shard %d but the layout still lists it: %w", r.ID, shard, err)
		}
	}
}

// quorumNeed is how many of shard's replicas other than peer's must be
// caught up before peer's replica is added (delta 1) or removed (delta
// -1): a quorum of the membership after the change, and all of them when
// there are fewer (a one-replica shard adds its second only while its
// first is caught up). others counts them; size is the membership after.
func quorumNeed(p *layout.Placement, shard uint64, peer string, delta int) (others []string, size, need int) {
	for _, r := range p.Replicas[shard] {
		if r.Peer != peer {
			others = append(others, r.Peer)
		}
	}
	size = len(others)
	if delta > 0 {
		size++
	}
	return others, size, min(size/2+1, len(others))
}

// CheckQuorum returns nil if shard's replicas other than peer's, as many
// as are caught up (they serve a linearizable read), form a quorum of the
// membership after adding (delta 1) or removing (delta -1) peer's replica;
// a shard of one replica adds its second only while that one is caught
// up. Otherwise it says which replicas lag. Each peer is asked within one
// ProposalTimeout, and asking stops once enough answered.
func (c *Controller) CheckQuorum(ctx context.Context, p *layout.Placement, shard uint64, peer string, delta int) error {
	others, size, need := quorumNeed(p, shard, peer, delta)
	caughtUp := 0
	var lagging []string
	for _, name := range others {
		if caughtUp >= need {
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, c.cfg.ProposalTimeout)
		err := c.cluster.CaughtUp(cctx, name, shard)
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
func (c *Controller) dropFromLayout(ctx context.Context, shard uint64, ids []uint64) error {
	p, err := c.cluster.ReadPlacement(ctx)
	if err != nil {
		return err
	}
	listed := func(o layout.Replica) bool { return slices.Contains(ids, o.ID) }
	if !slices.ContainsFunc(p.Replicas[shard], listed) {
		return nil
	}
	q := p.Next()
	q.Replicas[shard] = slices.DeleteFunc(q.Replicas[shard], listed)
	return c.cluster.ProposePlacement(ctx, q)
}

// reconcile makes the layout of shard agree with its Raft membership:
// replicas the layout lists but Raft removed (a controller that lost its
// meta leadership, or a layout write lost after the Raft change) are
// dropped from the layout. It reports whether it changed anything. The
// layout is what the controller plans from, so a replica counted there but
// gone from Raft would hide an under-replicated shard, or make a live
// replica look surplus.
func (c *Controller) reconcile(ctx context.Context, p *layout.Placement, shard uint64) (bool, error) {
	m, err := c.cluster.Membership(ctx, shard)
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
	if err := c.dropFromLayout(ctx, shard, gone); err != nil {
		return false, err
	}
	c.log.Warn("layout listed replicas Raft had removed; dropped them", "shard", shard, "replicas", gone)
	return true, nil
}

// balanceLeaders asks eligible peers which shards they lead and makes the
// one leadership transfer layout.PlanLeaderMove picks, if any.
func (c *Controller) balanceLeaders(ctx context.Context, p *layout.Placement, eligible []string) error {
	leaders := map[uint64]uint64{}
	for _, name := range eligible {
		st, err := c.cluster.Status(ctx, name)
		if err != nil {
			continue
		}
		for _, l := range st.Leading {
			leaders[l] = st.Replicas[l]
		}
	}
	// A new turn each round: a transfer that does not take (a target still
	// catching up) is not retried forever while other shards could move.
	c.mu.Lock()
	c.turn++
	turn := c.turn
	c.mu.Unlock()
	mv, ok := layout.PlanLeaderMove(p, eligible, leaders, turn)
	if !ok {
		c.log.Debug("controller: leadership balanced", "leaders", layout.LeaderCounts(p, eligible, leaders), "known", len(leaders))
		return nil
	}
	c.log.Debug("moving leadership", "shard", mv.Shard, "from", mv.From, "to", mv.To)
	c.mu.Lock()
	c.lastTransfer = time.Now()
	c.mu.Unlock()
	return c.cluster.TransferLeader(ctx, mv.From, mv.Shard, mv.Target)
}

// shardLeader asks the shard's hosts who leads it.
func (c *Controller) shardLeader(ctx context.Context, p *layout.Placement, shard uint64) (uint64, bool) {
	for _, name := range p.HostNames(shard) {
		if st, err := c.cluster.Status(ctx, name); err == nil {
			if id, ok := st.Leaders[shard]; ok && id != 0 {
				return id, true
			}
		}
	}
	return 0, false
}

// raiseLevel raises the cluster's feature level to the newest that every
// peer of the layout and every member of the mesh speaks. A peer of the
// layout that gossip does not see alive holds the level where it is: it
// may be an old release that comes back. It returns whether it proposed a
// new layout.
func (c *Controller) raiseLevel(ctx context.Context, p *layout.Placement, members []mesh.Member) (bool, error) {
	seen := map[string]bool{}
	var alive []mesh.Member
	for _, m := range members {
		if m.State == mesh.StateAlive {
			seen[m.Name] = true
			alive = append(alive, m)
		}
	}
	target := bootstrap.NewLevel(c.cfg.TopLevel, alive)
	for _, pe := range p.Peers {
		if !seen[pe.Name] {
			return false, nil
		}
	}
	if target <= layout.LevelOf(p) {
		return false, nil
	}
	// Gossip may still show the metadata of a peer's previous run (a peer
	// restarted on an older release); each peer of the layout, which runs
	// replicas, is asked itself.
	for _, pe := range p.Peers {
		st, err := c.cluster.Status(ctx, pe.Name)
		if err != nil {
			return false, nil
		}
		target = min(target, max(st.Level, level.Positional))
	}
	if target <= layout.LevelOf(p) {
		return false, nil
	}
	q := p.Next()
	q.Level = uint32(target)
	c.log.Info("raising the cluster's feature level", "from", layout.LevelOf(p), "to", target, "epoch", q.Epoch)
	return true, c.cluster.ProposePlacement(ctx, q)
}
