package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

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
func (n *Node) leadsShard(shard uint64) bool {
	id, ok := n.localReplica(shard)
	if !ok {
		return false
	}
	lid, _, valid, err := n.nh.GetLeaderID(shard)
	return err == nil && valid && lid == id
}

func (n *Node) controlStep() error {
	ctx, cancel := context.WithTimeout(n.ctx, n.proposalTimeout())
	defer cancel()
	p, err := n.readMetaPlacement(ctx)
	if err != nil {
		return err
	}
	now := n.now()
	alive := map[string]mesh.Member{}
	for _, m := range n.mesh.Members() {
		if m.State != mesh.StateAlive || m.Meta.NodeHostID == "" {
			continue
		}
		if !p.sameIdentity(m) {
			// The name is back with another NodeHost: the listed peer's
			// data dir was wiped, its replicas are gone with their logs,
			// so it counts as dead and is replaced after DeadAfter. The
			// new NodeHost is admitted once the name is forgotten.
			n.noteIdentityChange(p, m)
			continue
		}
		alive[m.Name] = m
	}

	// 1. Admit new peers.
	for name, m := range alive {
		if _, ok := p.peer(name); ok || m.Meta.NoReplicas || (m.Meta.Cluster != 0 && m.Meta.Cluster != p.ClusterID) {
			continue
		}
		q := p.next()
		q.Peers = append(q.Peers, peerEntry{Name: name, NodeHostID: m.Meta.NodeHostID})
		slices.SortFunc(q.Peers, func(a, b peerEntry) int { return cmpString(a.Name, b.Name) })
		n.log.Info("admitting peer", "peer", name, "epoch", q.Epoch)
		return n.proposePlacement(ctx, q)
	}

	// 2. Track dead peers; forget the gone ones that host nothing.
	n.ctrl.mu.Lock()
	eligible := []string{}
	var forget []string
	for _, pe := range p.Peers {
		if _, ok := alive[pe.Name]; ok {
			delete(n.ctrl.deadSince, pe.Name)
		} else if _, ok := n.ctrl.deadSince[pe.Name]; !ok {
			n.ctrl.deadSince[pe.Name] = now
		}
		since, dead := n.ctrl.deadSince[pe.Name]
		expired := dead && now.Sub(since) > n.cfg.DeadAfter
		switch {
		case !pe.Draining && !expired:
			eligible = append(eligible, pe.Name)
		case p.replicaCount(pe.Name) == 0 && (expired || (pe.Draining && dead)):
			// A draining peer is forgotten only once it is gone, or it
			// would be admitted again as a new peer while it shuts down.
			forget = append(forget, pe.Name)
		}
	}
	n.ctrl.mu.Unlock()
	if len(forget) > 0 {
		q := p.next()
		q.Peers = slices.DeleteFunc(q.Peers, func(pe peerEntry) bool { return slices.Contains(forget, pe.Name) })
		n.log.Info("forgetting peers", "peers", forget, "epoch", q.Epoch)
		return n.proposePlacement(ctx, q)
	}
	if len(eligible) == 0 {
		return nil
	}

	// 3. Move replicas toward the desired layout.
	desired := desiredLayout(p, eligible)
	floor := replicaFloor(p, alive)
	pending := false
	for _, shard := range p.shardIDs() {
		add, remove := planMove(p, shard, desired[shard], alive, floor)
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
		for _, shard := range p.shardIDs() {
			if changed, err := n.reconcile(ctx, p, shard); changed || err != nil {
				return err
			}
		}
	}
	// 4. Even out leadership, among peers that are up: a transfer to a
	// dead replica stalls the shard's proposals for an election timeout.
	var up []string
	for _, name := range eligible {
		if _, ok := alive[name]; ok {
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
func (n *Node) noteIdentityChange(p *placement, m mesh.Member) {
	pe, _ := p.peer(m.Name)
	n.ctrl.mu.Lock()
	seen := n.ctrl.newIdentity[m.Name] == m.Meta.NodeHostID
	n.ctrl.newIdentity[m.Name] = m.Meta.NodeHostID
	n.ctrl.mu.Unlock()
	if !seen {
		n.log.Warn("peer came back with another NodeHostID (data dir wiped or replaced); replacing the old one after DeadAfter, then admitting it as a new peer",
			"name", m.Name, "layout", pe.NodeHostID, "gossip", m.Meta.NodeHostID, "dead_after", n.cfg.DeadAfter)
	}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// replicaCount is the number of replicas name hosts.
func (p *placement) replicaCount(name string) int {
	c := 0
	for _, rs := range p.Replicas {
		for _, r := range rs {
			if r.Peer == name {
				c++
			}
		}
	}
	return c
}

// desiredLayout spreads RF replicas of every shard over the eligible peers
// with as few moves as possible: it keeps the current replicas on eligible
// peers, fills missing ones on the least loaded peers (rendezvous order
// breaking ties), trims extras from the most loaded, then moves replicas
// from the most to the least loaded peer until counts differ by at most
// one. Deterministic for the same layout and peers.
func desiredLayout(p *placement, eligible []string) map[uint64][]string {
	shards := p.shardIDs()
	rf := min(p.RF, len(eligible))
	count := map[string]int{}
	for _, name := range eligible {
		count[name] = 0
	}
	out := map[uint64][]string{}
	for _, shard := range shards {
		for _, name := range p.hostNames(shard) {
			if _, ok := count[name]; ok {
				out[shard] = append(out[shard], name)
				count[name]++
			}
		}
	}
	least := func(candidates []string) string {
		best := ""
		for _, name := range candidates {
			if best == "" || count[name] < count[best] {
				best = name
			}
		}
		return best
	}
	for _, shard := range shards {
		for len(out[shard]) < rf {
			var free []string
			for _, name := range mesh.Replicas(shard, eligible, len(eligible)) {
				if !slices.Contains(out[shard], name) {
					free = append(free, name)
				}
			}
			name := least(free)
			out[shard] = append(out[shard], name)
			count[name]++
		}
		for len(out[shard]) > rf {
			most := out[shard][0]
			for _, name := range out[shard] {
				if count[name] > count[most] {
					most = name
				}
			}
			out[shard] = slices.DeleteFunc(out[shard], func(n string) bool { return n == most })
			count[most]--
		}
	}
	sorted := append([]string(nil), eligible...)
	slices.Sort(sorted)
	for range len(shards) * rf {
		hi, lo := sorted[0], sorted[0]
		for _, name := range sorted {
			if count[name] > count[hi] {
				hi = name
			}
			if count[name] < count[lo] {
				lo = name
			}
		}
		if count[hi]-count[lo] <= 1 {
			break
		}
		moved := false
		for _, shard := range shards {
			if slices.Contains(out[shard], hi) && !slices.Contains(out[shard], lo) {
				i := slices.Index(out[shard], hi)
				out[shard][i] = lo
				count[hi]--
				count[lo]++
				moved = true
				break
			}
		}
		if !moved {
			break
		}
	}
	return out
}

// replicaFloor is the fewest replicas a planned change may leave a shard
// with: the replication factor, or every live listed peer when there are
// fewer. Draining peers count: their replicas stay until others can take
// them, so a Leave that would take shards below RF waits instead. Only a
// dead peer takes a shard below it.
func replicaFloor(p *placement, alive map[string]mesh.Member) int {
	live := 0
	for _, pe := range p.Peers {
		if _, ok := alive[pe.Name]; ok {
			live++
		}
	}
	return min(p.RF, live)
}

// planMove picks the next step for shard: a replica on a dead peer to
// remove first (adding a member while one is dead would raise the quorum
// while a member cannot vote), else a peer to add a replica on, else (only
// once the shard has more than it needs, and more than floor) a surplus
// replica to remove.
func planMove(p *placement, shard uint64, want []string, alive map[string]mesh.Member, floor int) (add string, remove *replica) {
	cur := p.Replicas[shard]
	for i := range cur {
		if _, up := alive[cur[i].Peer]; !up && !slices.Contains(want, cur[i].Peer) {
			return "", &cur[i]
		}
	}
	for _, name := range want {
		if !p.hosts(shard, name) {
			return name, nil
		}
	}
	if len(cur) <= max(len(want), floor) {
		return "", nil
	}
	for i := range cur {
		if !slices.Contains(want, cur[i].Peer) {
			return "", &cur[i]
		}
	}
	return "", nil
}

// moveReplica performs one step of a shard's move.
func (n *Node) moveReplica(shard uint64, add string, remove *replica) error {
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
	pe, ok := p.peer(peer)
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
	r, ok := p.replica(shard, peer)
	if !ok {
		// The layout first: a replica listed but not yet a Raft member is
		// harmless (requests to it are refused and retried elsewhere); a
		// member missing from the layout would never be started.
		q := p.next()
		r = replica{Peer: peer, ID: q.NextReplicaID, Join: true}
		q.NextReplicaID++
		q.Replicas[shard] = append(q.Replicas[shard], r)
		slices.SortFunc(q.Replicas[shard], func(a, b replica) int { return cmpString(a.Peer, b.Peer) })
		if err := n.proposePlacement(ctx, q); err != nil {
			return err
		}
	}
	if err := n.configChange(ctx, configChangeReq{Shard: shard, Add: true, Replica: r.ID, NodeHostID: pe.NodeHostID}); err != nil {
		if errCode(err) == codeRejected {
			// The id was used and removed before: drop it from the layout,
			// the next step adds the replica under a fresh id.
			if p, rerr := n.readMetaPlacement(ctx); rerr == nil {
				q := p.next()
				q.Replicas[shard] = slices.DeleteFunc(q.Replicas[shard], func(o replica) bool { return o.ID == r.ID })
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

func (n *Node) removeReplica(ctx context.Context, shard uint64, r replica) error {
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
			_, _ = n.callPeerName(ctx, r.Peer, methodTransferLeader, mustEncode(transferReq{Shard: shard, Target: target}))
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
func (n *Node) checkQuorum(ctx context.Context, p *placement, shard uint64, peer string, delta int) error {
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
	listed := func(o replica) bool { return slices.Contains(ids, o.ID) }
	if !slices.ContainsFunc(p.Replicas[shard], listed) {
		return nil
	}
	q := p.next()
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
func (n *Node) reconcile(ctx context.Context, p *placement, shard uint64) (bool, error) {
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

// balanceLeaders moves one leadership from the peer leading the most shards
// to one leading the fewest, if they differ by two or more.
func (n *Node) balanceLeaders(ctx context.Context, p *placement, eligible []string) error {
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
	count := map[string]int{}
	for _, name := range eligible {
		count[name] = 0
	}
	ledBy := map[string][]uint64{}
	for shard, id := range leaders {
		if pe, ok := p.peerByReplica(id); ok {
			count[pe.Name]++
			ledBy[pe.Name] = append(ledBy[pe.Name], shard)
		}
	}
	byCount := append([]string(nil), eligible...)
	slices.SortStableFunc(byCount, func(a, b string) int { return count[b] - count[a] })
	transfer := func(from, to string, shard uint64) error {
		target, _ := p.replicaID(shard, to)
		n.log.Debug("moving leadership", "shard", shard, "from", from, "to", to)
		n.ctrl.mu.Lock()
		n.ctrl.lastTransfer = time.Now()
		n.ctrl.mu.Unlock()
		_, err := n.callPeerName(ctx, from, methodTransferLeader, mustEncode(transferReq{Shard: shard, Target: target}))
		return err
	}
	// Candidates are tried from a rotating start, so a transfer that does
	// not take (a target still catching up) is not retried forever while
	// other shards could move.
	n.ctrl.mu.Lock()
	n.ctrl.turn++
	turn := n.ctrl.turn
	n.ctrl.mu.Unlock()
	canGive := func(from, to string) (uint64, bool) {
		shards := ledBy[from]
		slices.Sort(shards)
		for i := range shards {
			if shard := shards[(i+turn)%len(shards)]; p.hosts(shard, to) {
				return shard, true
			}
		}
		return 0, false
	}
	// The most loaded peer that can hand a shard to a peer leading at
	// least two fewer.
	for _, most := range byCount {
		for i := len(byCount) - 1; i >= 0; i-- {
			least := byCount[i]
			if count[most]-count[least] < 2 {
				break
			}
			if shard, ok := canGive(most, least); ok {
				return transfer(most, least, shard)
			}
		}
	}
	// No direct move: let a peer one above the least loaded give it a
	// shard, if the most loaded can then give that peer one next round.
	most, least := byCount[0], byCount[len(byCount)-1]
	if count[most]-count[least] >= 2 {
		for _, mid := range byCount {
			if mid == most || count[mid] <= count[least] {
				continue
			}
			if _, ok := canGive(most, mid); !ok {
				continue
			}
			if shard, ok := canGive(mid, least); ok {
				return transfer(mid, least, shard)
			}
		}
	}
	n.log.Debug("controller: leadership balanced", "leaders", count, "known", len(leaders))
	return nil
}

// shardLeader asks the shard's hosts who leads it.
func (n *Node) shardLeader(ctx context.Context, p *placement, shard uint64) (uint64, bool) {
	for _, name := range p.hostNames(shard) {
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
	_, err := n.callPeerName(ctx, peer, methodCaughtUp, mustEncode(shardReq{Shard: shard}))
	return err
}
