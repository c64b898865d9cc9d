package node

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/lni/dragonboat/v4"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/router"
)

// Requests of the controller and of a leaving peer.
type shardReq struct {
	Shard uint64 `msgpack:"s"`
}

type configChangeReq struct {
	Shard      uint64 `msgpack:"s"`
	Add        bool   `msgpack:"a"`
	Replica    uint64 `msgpack:"r"`
	NodeHostID string `msgpack:"h"`
}

type transferReq struct {
	Shard  uint64 `msgpack:"s"`
	Target uint64 `msgpack:"t"`
}

// membershipResp is a shard's Raft membership, read linearizably.
type membershipResp struct {
	Members []uint64 `msgpack:"m"` // voting replica ids
	Removed []uint64 `msgpack:"r"` // ids removed from the shard, never to return
}

// statusResp is what a peer says of the replicas it runs.
type statusResp struct {
	Replicas map[uint64]uint64 `msgpack:"r"` // shard -> local replica id
	Leaders  map[uint64]uint64 `msgpack:"l"` // shard -> leader replica id, as seen here
	Leading  []uint64          `msgpack:"x"` // shards this peer leads
	// Level is the newest feature level the peer speaks; 0 from releases
	// before levels, which speak only level 1.
	Level uint8 `msgpack:"v,omitempty"`
}

// callPeerWith encodes req and calls the peer named name with it.
func (n *Node) callPeerWith(ctx context.Context, name string, method uint8, req any) ([]byte, error) {
	body, err := encodeBody(req)
	if err != nil {
		return nil, err
	}
	return n.callPeerName(ctx, name, method, body)
}

// serveMembership answers the controller's and leaving peers' requests.
func (n *Node) serveMembership(ctx context.Context, method uint8, body []byte) ([]byte, error) {
	if p := n.placement.Load(); p != nil && !n.authzOff() && (method == methodConfigChange || method == methodTransferLeader) {
		if err := authz.MetaMember(callerOf(ctx), p.HostNames(metaShardID), "membership change"); err != nil {
			return nil, n.refused(err)
		}
	}
	switch method {
	case methodStatus:
		st := statusResp{Replicas: n.replicas.Running(), Leaders: map[uint64]uint64{}, Level: n.topLevel()}
		for shard, id := range st.Replicas {
			if lid, ok := n.replicas.Leader(shard); ok {
				st.Leaders[shard] = lid
				if lid == id {
					st.Leading = append(st.Leading, shard)
				}
			}
		}
		return encodeBody(st)
	case methodConfigChange:
		var req configChangeReq
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
		defer cancel()
		// Idempotent: a change whose first try timed out may have been
		// applied, and the controller that asked may have lost the layout
		// write that follows it; asking again must succeed.
		m, err := n.localMembership(ctx, req.Shard)
		if err != nil {
			return nil, err
		}
		_, member := m.Nodes[req.Replica]
		if _, removed := m.Removed[req.Replica]; removed && req.Add {
			return nil, rpcError(codeRejected, "replica %d was removed from shard %d and cannot be added back", req.Replica, req.Shard)
		}
		switch {
		case req.Add && member, !req.Add && !member:
			return nil, nil
		case req.Add:
			err = n.nh.SyncRequestAddReplica(ctx, req.Shard, req.Replica, req.NodeHostID, 0)
		default:
			err = n.nh.SyncRequestDeleteReplica(ctx, req.Shard, req.Replica, 0)
		}
		return nil, busyErr(req.Shard, err)
	case methodMembership:
		var req shardReq
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
		defer cancel()
		m, err := n.localMembership(ctx, req.Shard)
		if err != nil {
			return nil, err
		}
		var resp membershipResp
		for id := range m.Nodes {
			resp.Members = append(resp.Members, id)
		}
		for id := range m.Removed {
			resp.Removed = append(resp.Removed, id)
		}
		return encodeBody(resp)
	case methodTransferLeader:
		var req transferReq
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		if !n.hostsShard(req.Shard) {
			return nil, rpcError(codeNotHosted, "peer %s hosts no replica of shard %d", n.cfg.Name, req.Shard)
		}
		return nil, n.nh.RequestLeaderTransfer(req.Shard, req.Target)
	case methodCaughtUp:
		var req shardReq
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		if !n.hostsShard(req.Shard) {
			return nil, rpcError(codeNotHosted, "peer %s does not run shard %d yet", n.cfg.Name, req.Shard)
		}
		rctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
		defer cancel()
		// Any linearizable read will do (the meta shard answers every query
		// with the layout).
		if _, err := n.nh.SyncRead(rctx, req.Shard, replica.Query{Kind: replica.QuerySessions}); err != nil {
			return nil, rpcError(codeBusy, "shard %d not caught up: %v", req.Shard, err)
		}
		return nil, nil
	case methodSetPlacement:
		if !n.hostsShard(metaShardID) {
			return nil, rpcError(codeNotHosted, "peer %s hosts no meta replica", n.cfg.Name)
		}
		q, err := layout.Decode(body)
		if err != nil {
			return nil, err
		}
		if err := n.authorizeLayout(ctx, q); err != nil {
			return nil, err
		}
		return nil, n.proposePlacement(ctx, q)
	}
	return nil, fmt.Errorf("unknown membership method %d", method)
}

// authorizeLayout applies authz.LayoutChange to q, a layout a caller asks
// this meta host to write, against the layout the meta shard holds now
// (this peer's copy when the meta replica cannot answer).
func (n *Node) authorizeLayout(ctx context.Context, q *layout.Placement) error {
	c := callerOf(ctx)
	if c.Anonymous() || n.authzOff() {
		return nil
	}
	cur, err := n.readLocalPlacement(ctx)
	if err != nil {
		if cur = n.placement.Load(); cur == nil {
			return busyErr(metaShardID, err)
		}
	}
	return n.refused(authz.LayoutChange(c, cur, q))
}

// localMembership reads shard's Raft membership through this peer's
// replica, linearizably; a retryable failure is answered as codeBusy.
func (n *Node) localMembership(ctx context.Context, shard uint64) (*dragonboat.Membership, error) {
	if !n.hostsShard(shard) {
		return nil, rpcError(codeNotHosted, "peer %s hosts no replica of shard %d", n.cfg.Name, shard)
	}
	m, err := n.nh.SyncGetShardMembership(ctx, shard)
	return m, busyErr(shard, err)
}

// busyErr turns a retryable error of shard into codeBusy, so that the
// calling peer retries; other errors and nil pass through.
func busyErr(shard uint64, err error) error {
	if err != nil && retryable(err) {
		return rpcError(codeBusy, "shard %d: %v", shard, err)
	}
	return err
}

// callPeerName calls the named peer, or serves the call here.
func (n *Node) callPeerName(ctx context.Context, name string, method uint8, body []byte) ([]byte, error) {
	if name == n.cfg.Name {
		return n.handle(ctx, method, body)
	}
	addr, ok := n.rpcAddr(name)
	if !ok {
		return nil, fmt.Errorf("%w: no address for peer %q", ErrUnavailable, name)
	}
	return n.peers.Call(ctx, addr, method, body)
}

// configChange asks a host of the shard to change its Raft membership.
func (n *Node) configChange(ctx context.Context, req configChangeReq) error {
	p := n.placement.Load()
	body, err := encodeBody(req)
	if err != nil {
		return err
	}
	return n.router.TryHosts(ctx, router.Tries{
		Shard:      req.Shard,
		Rounds:     20,
		MaxBackoff: 3,
		// The likely leader first, then every host of the newest layout
		// this peer knows.
		Hosts: func(int) []string {
			if q := n.placement.Load(); q != nil {
				p = q
			}
			hosts := p.HostNames(req.Shard)
			if l := n.leaderGuess(req.Shard); l != "" {
				hosts = append([]string{l}, hosts...)
			}
			return hosts
		},
		Call: func(ctx context.Context, h string) error {
			_, err := n.callPeerName(ctx, h, methodConfigChange, body)
			return err
		},
		// A host that refuses the change (a removed replica cannot come
		// back) speaks for the shard: no other host will accept it.
		Judge: func(_ string, err error) router.Step {
			if errCode(err) == codeRejected {
				return router.Stop
			}
			return router.NextHost
		},
		NoneTried: errors.New("no host"),
	})
}

// membership reads shard's Raft membership from a peer hosting it.
func (n *Node) membership(ctx context.Context, shard uint64) (membershipResp, error) {
	var m membershipResp
	body, err := encodeBody(shardReq{Shard: shard})
	if err != nil {
		return m, err
	}
	raw, err := n.callHost(ctx, shard, methodMembership, body)
	if err == nil {
		err = decodeBody(raw, &m)
	}
	return m, err
}

// readMetaPlacement reads the layout from the meta shard, linearizably.
//
// The local meta replica answers when this peer has one and it is caught
// up. A replica still joining cannot, nor can one removed from the shard
// while this peer was cut off (it never hears of its removal), so the meta
// hosts of this peer's copy of the layout are asked next, each to read
// through its own meta replica. If that copy is so old that none of them
// hosts one any more, the peers it lists are asked for their copies, and
// the meta hosts of the newest are asked in turn.
func (n *Node) readMetaPlacement(ctx context.Context) (*layout.Placement, error) {
	var lastErr error = errNotReady
	if n.hostsShard(metaShardID) {
		// A short try: a replica that is still joining, or was just
		// removed from the shard, would spend the whole budget waiting.
		lctx, cancel := context.WithTimeout(ctx, n.proposalTimeout()/2)
		p, err := n.readLocalPlacement(lctx)
		cancel()
		if err == nil {
			return p, nil
		}
		lastErr = err
	}
	p := n.placement.Load()
	if p == nil {
		return nil, errNotReady
	}
	asked := map[string]bool{n.cfg.Name: true}
	errAsked := errors.New("asked already")
	ask := func(hosts []string) *layout.Placement {
		var q *layout.Placement
		err := n.router.TryHosts(ctx, router.Tries{
			Shard:  metaShardID,
			Rounds: 1,
			Hosts:  func(int) []string { return hosts },
			Call: func(ctx context.Context, h string) error {
				if asked[h] || ctx.Err() != nil {
					return errAsked
				}
				asked[h] = true
				raw, err := n.callPeerName(ctx, h, methodGetPlacement, getPlacementLinearizable)
				if err == nil {
					q, err = layout.Decode(raw)
				}
				if err != nil {
					return fmt.Errorf("peer %s: %w", h, err)
				}
				return nil
			},
			Judge: func(_ string, err error) router.Step {
				if err == errAsked {
					return router.Skip
				}
				return router.NextHost
			},
			NoneTried: lastErr,
		})
		if err != nil {
			lastErr = err
			return nil
		}
		return q
	}
	if q := ask(p.HostNames(metaShardID)); q != nil {
		return q, nil
	}
	newest := p
	for _, pe := range p.Peers {
		if pe.Name == n.cfg.Name || ctx.Err() != nil {
			continue
		}
		raw, err := n.callPeerName(ctx, pe.Name, methodGetPlacement, nil)
		if err != nil {
			continue
		}
		if q, err := layout.Decode(raw); err == nil && q.ClusterID == p.ClusterID && q.Epoch > newest.Epoch {
			newest = q
		}
	}
	if q := ask(newest.HostNames(metaShardID)); q != nil {
		return q, nil
	}
	return nil, lastErr
}

func (n *Node) readLocalPlacement(ctx context.Context) (*layout.Placement, error) {
	rctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
	defer cancel()
	v, err := n.nh.SyncRead(rctx, metaShardID, nil)
	if err != nil {
		return nil, err
	}
	raw, _ := v.([]byte)
	if len(raw) == 0 {
		return nil, errNotReady
	}
	return layout.Decode(raw)
}

// proposePlacement writes q, the successor of the current layout, into the
// meta shard. It fails if another change got in first.
func (n *Node) proposePlacement(ctx context.Context, q *layout.Placement) error {
	raw, err := layout.Encode(q)
	if err != nil {
		return err
	}
	if !n.hostsShard(metaShardID) {
		p := n.placement.Load()
		return n.router.TryHosts(ctx, router.Tries{
			Shard:  metaShardID,
			Rounds: 1,
			// Not this peer: it is no meta host (its copy of the layout
			// lags the one that says so).
			Hosts: func(int) []string {
				return slices.DeleteFunc(p.HostNames(metaShardID), func(h string) bool { return h == n.cfg.Name })
			},
			Call: func(ctx context.Context, h string) error {
				_, err := n.callPeerName(ctx, h, methodSetPlacement, raw)
				return err
			},
			NoneTried: errNotReady,
		})
	}
	pctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
	defer cancel()
	r, err := n.nh.SyncPropose(pctx, n.nh.GetNoOPSession(metaShardID), raw)
	if err != nil {
		return err
	}
	if r.Value == replica.MetaHalted {
		return fmt.Errorf("%w: %s", ErrReplicaHalted, r.Data)
	}
	if r.Value != q.Epoch {
		return fmt.Errorf("layout changed concurrently: epoch %d was already written; will retry from the new layout", q.Epoch)
	}
	return nil
}

// placementLoop keeps this peer's copy of the layout current and starts or
// stops local replicas to match it.
func (n *Node) placementLoop() {
	n.every(n.controlInterval(), func() {
		cur := n.placement.Load()
		if cur == nil {
			return
		}
		ctx, cancel := context.WithTimeout(n.ctx, 2*n.proposalTimeout())
		q, err := n.readMetaPlacement(ctx)
		cancel()
		if err != nil || q.Epoch <= cur.Epoch || q.ClusterID != cur.ClusterID {
			return
		}
		if err := n.updatePlacement(q); err != nil {
			n.log.Warn("apply new layout", "epoch", q.Epoch, "err", err)
		}
	})
}

// noteShortfall tells the operator when shards run with fewer replicas
// than the replication factor (too few peers: ReplicationFactor above the
// peer count, or a dead peer not yet replaced), and when that ends. old is
// nil for the first layout.
func (n *Node) noteShortfall(old, q *layout.Placement) {
	short, fewest := q.ShortShards()
	was := 0
	if old != nil {
		was, _ = old.ShortShards()
	}
	switch {
	case short > 0 && (old == nil || short != was):
		n.log.Warn("shards have fewer replicas than the replication factor; they need more peers",
			"short_shards", short, "shards", len(q.ShardIDs()), "fewest_replicas", fewest,
			"replication_factor", q.RF, "peers", len(q.Peers))
	case short == 0 && was > 0:
		n.log.Info("every shard has its replication factor again", "replication_factor", q.RF)
	}
}

// updatePlacement adopts a newer layout: it records it, starts the replicas
// it adds here and stops the ones it removed from here. A layout that lists
// this peer's name under another NodeHostID (another peer runs under the
// same Name) is refused: its replicas for the name are not this peer's.
func (n *Node) updatePlacement(q *layout.Placement) error {
	if ie := q.CheckIdentity(n.cfg.Name, n.nh.ID()); ie != nil {
		n.refuseLayout(ie)
		return ie
	}
	if err := n.checkLevel(q); err != nil {
		return err
	}
	if err := n.saveRecord(q); err != nil {
		return err
	}
	n.noteShortfall(n.placement.Load(), q)
	n.placement.Store(q)
	for _, shard := range q.ShardIDs() {
		r, listed := q.Replica(shard, n.cfg.Name)
		id, running := n.localReplica(shard)
		switch {
		case listed && !running:
			if err := n.startReplica(q, shard, r); err != nil {
				n.log.Warn("start replica", "shard", shard, "err", err)
			}
		case running && (!listed || r.ID != id):
			n.stopReplica(shard)
		}
	}
	return nil
}

// Leave moves this peer out of the cluster gracefully: it asks for its
// replicas and leaderships to be moved to other peers, waits until they
// are (the cluster never drops below the replication factor, so this needs
// enough other peers), then closes its sessions, handing their locks on,
// and closes the node. If ctx ends first the peer stays draining and
// running, and Leave returns an error.
func (n *Node) Leave(ctx context.Context) error {
	if n.isClosed() {
		return ErrClosed
	}
	if _, err := n.waitReady(ctx); err != nil {
		return err
	}
	// last says why the newest attempt made no progress, for the error
	// Leave returns if ctx ends first.
	var last error
	for attempt := 0; ; attempt++ {
		p, err := n.readMetaPlacement(ctx)
		if err != nil {
			last = fmt.Errorf("reading the layout: %w", err)
		} else {
			pe, listed := p.Peer(n.cfg.Name)
			if !listed || p.ReplicaCount(n.cfg.Name) == 0 {
				break
			}
			last = fmt.Errorf("layout epoch %d still gives this peer %d replicas", p.Epoch, p.ReplicaCount(n.cfg.Name))
			if !pe.Draining {
				q := p.Next()
				for i := range q.Peers {
					if q.Peers[i].Name == n.cfg.Name {
						q.Peers[i].Draining = true
					}
				}
				if err := n.proposePlacement(ctx, q); err != nil {
					last = fmt.Errorf("marking this peer draining: %w", err)
				} else {
					n.log.Info("draining: replicas will move to other peers")
				}
			}
		}
		if err := n.backoff(ctx, min(attempt, 4)); err != nil {
			return fmt.Errorf("leave: replicas not moved away in time (is there a peer to take them?): %w (last: %v)", err, last)
		}
	}
	// Wait for this peer's copy to drop the last replica too.
	for n.replicas.Count() > 0 {
		if err := n.backoff(ctx, 2); err != nil {
			return fmt.Errorf("leave: %w", err)
		}
	}
	return n.Close()
}
