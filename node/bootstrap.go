package node

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/cluster"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// Forming a cluster: the rules (who coordinates, what a promise refuses,
// which commit is adopted) are pure code in internal/cluster; this file
// runs them: the loop, the RPCs on both sides, and adopting the result.

const recordFile = "cluster.lockmesh"

func (n *Node) bootstrapLoop() {
	t := time.NewTicker(max(4*n.cfg.RTT, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.ready:
			return
		case <-n.stop:
			return
		case <-t.C:
		}
		if err := n.bootstrapStep(); err != nil {
			n.log.Debug("bootstrap step", "err", err)
		}
	}
}

// bootstrapStep does what cluster.Decide says: adopt a running cluster's
// layout, coordinate the founding of one, or nothing yet.
func (n *Node) bootstrapStep() error {
	f := cluster.Decide(n.mesh.Members(), n.cfg.Name, n.cfg.BootstrapExpect)
	switch {
	case f.AdoptFrom != nil:
		return n.fetchPlacement(*f.AdoptFrom)
	case f.Founders != nil:
		return n.coordinate(f.Founders)
	}
	return nil
}

// fetchPlacement adopts the layout of the cluster member m belongs to.
func (n *Node) fetchPlacement(m mesh.Member) error {
	ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
	defer cancel()
	raw, err := n.peers.Call(ctx, m.Meta.RPCAddr, methodGetPlacement, nil)
	if err != nil {
		return fmt.Errorf("get layout from %s: %w", m.Name, err)
	}
	p, err := layout.Decode(raw)
	if err != nil {
		return err
	}
	return n.commitPlan(p)
}

func (n *Node) coordinate(members []mesh.Member) error {
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	cid := binary.BigEndian.Uint64(idb[:]) | 1
	p := cluster.NewPlan(cid, n.cfg.Shards, n.cfg.ReplicationFactor, n.topLevel(), members)
	raw, err := layout.Encode(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(n.ctx, 2*time.Second)
	defer cancel()
	var promised []mesh.Member
	var failed error
	for _, m := range members {
		if _, err := n.callPeer(ctx, m, methodPrepare, raw); err != nil {
			failed = fmt.Errorf("peer %s refused plan: %w", m.Name, err)
			break
		}
		promised = append(promised, m)
	}
	if failed != nil {
		var cidb [8]byte
		binary.BigEndian.PutUint64(cidb[:], cid)
		for _, m := range promised {
			_, _ = n.callPeer(ctx, m, methodAbort, cidb[:])
		}
		return failed
	}
	n.log.Info("forming cluster", "cluster", cid, "peers", len(members), "shards", p.Shards)
	for _, m := range members {
		if m.Name == n.cfg.Name {
			continue
		}
		if _, err := n.callPeer(ctx, m, methodCommit, raw); err != nil {
			// It adopts the layout from a committed member once its promise lapses.
			n.log.Warn("commit not delivered", "peer", m.Name, "err", err)
		}
	}
	return n.commitPlan(p)
}

// callPeer calls m, or serves the call locally when m is this peer.
func (n *Node) callPeer(ctx context.Context, m mesh.Member, method uint8, body []byte) ([]byte, error) {
	if m.Name == n.cfg.Name {
		return n.serveBootstrap(ctx, method, body)
	}
	return n.peers.Call(ctx, m.Meta.RPCAddr, method, body)
}

func (n *Node) serveBootstrap(ctx context.Context, method uint8, body []byte) ([]byte, error) {
	switch method {
	case methodGetPlacement:
		return n.currentPlacement(ctx, bytes.Equal(body, cluster.GetPlacementLinearizable))
	case methodAbort:
		if len(body) != 8 {
			return nil, errors.New("abort: bad cluster id")
		}
		cid := binary.BigEndian.Uint64(body)
		n.bootMu.Lock()
		defer n.bootMu.Unlock()
		if promised := n.promises.PromiseFor(cid); promised != nil {
			if err := n.authorizeBootstrap(ctx, promised, "abort"); err != nil {
				return nil, err
			}
			n.promises.Abort(cid)
		}
		return nil, nil
	}
	p, err := layout.Decode(body)
	if err != nil {
		return nil, err
	}
	if self, ok := p.Peer(n.cfg.Name); !ok || self.NodeHostID != n.nh.ID() {
		return nil, rpcError(codeRejected, "plan does not list peer %s with NodeHostID %s", n.cfg.Name, n.nh.ID())
	}
	what := map[uint8]string{methodPrepare: "prepare", methodCommit: "commit"}[method]
	if err := n.authorizeBootstrap(ctx, p, what); err != nil {
		return nil, err
	}
	if method == methodPrepare {
		n.bootMu.Lock()
		defer n.bootMu.Unlock()
		if cur := n.placement.Load(); cur != nil {
			return nil, rpcError(codeRejected, "peer %s already belongs to cluster %d", n.cfg.Name, cur.ClusterID)
		}
		if err := n.promises.Prepare(p, body, n.now()); err != nil {
			return nil, rpcError(codeRejected, "peer %s promised another plan", n.cfg.Name)
		}
		n.adopting.Store(p) // its founders' Raft connections are expected
		return nil, nil
	}
	if method == methodCommit {
		// Only the plan this peer promised: anyone else's commit, or one
		// sent to a joiner that promised nothing, would write a foreign
		// cluster into the data dir.
		n.bootMu.Lock()
		promised := n.promises.Promised()
		n.bootMu.Unlock()
		if cur := n.placement.Load(); cur == nil && !n.authzOff() {
			if err := authz.BootstrapCommit(promised, body); err != nil {
				return nil, n.refused(err)
			}
		}
		return nil, n.commitPlan(p)
	}
	return nil, fmt.Errorf("unknown bootstrap method %d", method)
}

// authorizeBootstrap applies authz.BootstrapCall: with identity, a
// bootstrap call comes from a founder plan lists.
func (n *Node) authorizeBootstrap(ctx context.Context, plan *layout.Placement, what string) error {
	if n.authzOff() {
		return nil
	}
	return n.refused(authz.BootstrapCall(callerOf(ctx), plan, what))
}

// commitPlan adopts p unless this peer already has a layout.
func (n *Node) commitPlan(p *layout.Placement) error {
	n.bootMu.Lock()
	defer n.bootMu.Unlock()
	if cur := n.placement.Load(); cur != nil {
		if cur.ClusterID != p.ClusterID {
			return rpcError(codeRejected, "peer %s already belongs to cluster %d", n.cfg.Name, cur.ClusterID)
		}
		return nil
	}
	n.promises.Settle()
	if err := n.adopt(p); err != nil {
		var ie *layout.IdentityError
		if errors.As(err, &ie) {
			n.refuseLayout(ie)
		}
		return err
	}
	n.refusal.Store(nil)
	meta := n.localMeta()
	meta.Cluster = p.ClusterID
	if err := n.mesh.SetMeta(meta); err != nil {
		n.log.Warn("gossip cluster id", "err", err)
	}
	if n.hostsShard(metaShardID) {
		n.goFunc(func() { n.publishPlacement(p) })
	}
	return nil
}

// refuseLayout records why this peer does not adopt the layout, for lock
// calls waiting for it, and logs it when the reason is new. The bootstrap
// loop keeps asking for the layout: once the cluster has replaced the old
// identity and forgotten the name, the layout no longer lists it and the
// peer is admitted as a new one, with new replica ids.
func (n *Node) refuseLayout(ie *layout.IdentityError) {
	if old := n.refusal.Swap(ie); old == nil || *old != *ie {
		n.log.Error("refusing the cluster layout", "err", ie)
	}
}

func (n *Node) localMeta() mesh.Meta {
	if m, ok := n.mesh.Member(n.cfg.Name); ok {
		return m.Meta
	}
	return n.baseMeta()
}

// baseMeta is what this peer gossips about itself before it belongs to a
// cluster.
func (n *Node) baseMeta() mesh.Meta {
	m := mesh.Meta{RaftAddr: n.cfg.RaftAddr, RPCAddr: n.rpc.Addr(), MinVersion: minLevel, Version: n.topLevel(), NoReplicas: n.cfg.NoReplicas,
		JoinOnly: n.cfg.BootstrapExpect == 0}
	if n.nh != nil {
		m.NodeHostID = n.nh.ID()
	}
	return m
}

// publishPlacement writes p into the meta shard (a no-op if a placement of
// the same or a later epoch is there), retrying until it lands or the node
// closes.
func (n *Node) publishPlacement(p *layout.Placement) {
	raw, err := layout.Encode(p)
	if err != nil {
		return
	}
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(n.ctx, n.proposalTimeout())
		_, err := n.nh.SyncPropose(ctx, n.nh.GetNoOPSession(metaShardID), raw)
		cancel()
		if err == nil || n.isClosed() {
			return
		}
		if n.backoff(n.ctx, attempt) != nil {
			return
		}
	}
}

// currentPlacement answers methodGetPlacement: the layout read through this
// peer's meta replica if it has one, else (unless linearizable: the body
// is cluster.GetPlacementLinearizable) this peer's own copy, which may be
// behind.
//
// A copy must not pass for a read: two peers whose meta replicas were both
// removed while they were cut off would each ask the other and adopt
// nothing newer than their own copies, for ever.
func (n *Node) currentPlacement(ctx context.Context, linearizable bool) ([]byte, error) {
	p := n.placement.Load()
	if p == nil {
		return nil, rpcError(codeNoCluster, "peer %s is not in a cluster yet", n.cfg.Name)
	}
	if n.hostsShard(metaShardID) {
		q, err := n.membership.ReadLocalPlacement(ctx)
		if err == nil {
			return layout.Encode(q)
		}
		if linearizable {
			return nil, rpcError(codeBusy, "peer %s cannot read the layout from its meta replica: %v", n.cfg.Name, err)
		}
	} else if linearizable {
		return nil, rpcError(codeNotHosted, "peer %s hosts no meta replica", n.cfg.Name)
	}
	return layout.Encode(p)
}

// saveRecord writes the layout to the data dir atomically and durably: the
// record is synced, renamed into place, and the directory synced so the
// rename survives a power cut. A peer that lost its record would come back
// with Raft data and no cluster, and could form a new one.
func (n *Node) saveRecord(p *layout.Placement) error {
	raw, err := layout.Encode(p)
	if err != nil {
		return err
	}
	if err := n.writeDurably(recordFile, raw); err != nil {
		return fmt.Errorf("cluster record: %w", err)
	}
	return nil
}

// loadRecord reads the layout from the data dir; nil when there is none.
func (n *Node) loadRecord() (*layout.Placement, error) {
	path := n.cfg.fs.PathJoin(n.cfg.DataDir, recordFile)
	raw, err := n.readSmall(recordFile)
	if raw == nil || err != nil {
		return nil, err
	}
	p, err := layout.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("cluster record %s is corrupt: %w", path, err)
	}
	if _, ok := p.Peer(n.cfg.Name); !ok && len(n.cfg.Join) == 0 {
		return nil, fmt.Errorf("cluster record %s does not list peer %q", path, n.cfg.Name)
	}
	if ie := p.CheckIdentity(n.cfg.Name, n.nh.ID()); ie != nil {
		return nil, fmt.Errorf("cluster record %s lists peer %q with NodeHostID %s but the Raft data beside it has %s: "+
			"part of the data dir was deleted or replaced, or it was copied; delete the whole data dir to rejoin as a new peer, or start under a new Name",
			path, n.cfg.Name, ie.Listed, ie.Local)
	}
	return p, nil
}
