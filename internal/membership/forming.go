package membership

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/bootstrap"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/mesh"
)

// Forming a cluster: the rules (who coordinates, what a promise refuses,
// which commit is adopted) are pure code in bootstrap.go; this file runs
// them: the loop, the RPCs on both sides, and the hand-over of the result
// to the peer (Local.Adopt).

// RunBootstrap does what Decide says every BootstrapInterval (adopt a
// running cluster's layout, coordinate the founding of one, or nothing
// yet) until ready closes, this peer having adopted a layout, or ctx ends.
func (s *Service) RunBootstrap(ctx context.Context, ready <-chan struct{}) {
	t := time.NewTicker(s.cfg.BootstrapInterval)
	defer t.Stop()
	for {
		select {
		case <-ready:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := s.bootstrapStep(ctx); err != nil {
			s.log.Debug("bootstrap step", "err", err)
		}
	}
}

// bootstrapStep does what Decide says: adopt a running cluster's layout,
// coordinate the founding of one, or nothing yet.
func (s *Service) bootstrapStep(ctx context.Context) error {
	f := bootstrap.Decide(s.mesh.Members(), s.cfg.Name, s.cfg.BootstrapExpect)
	switch {
	case f.AdoptFrom != nil:
		return s.fetchPlacement(ctx, *f.AdoptFrom)
	case f.Founders != nil:
		return s.coordinate(ctx, f.Founders)
	}
	return nil
}

// fetchPlacement adopts the layout of the cluster member m belongs to.
func (s *Service) fetchPlacement(ctx context.Context, m mesh.Member) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	raw, err := s.cfg.Peers.Call(ctx, m.Meta.RPCAddr, s.cfg.Methods.GetPlacement, nil)
	if err != nil {
		return fmt.Errorf("get layout from %s: %w", m.Name, err)
	}
	p, err := layout.Decode(raw)
	if err != nil {
		return err
	}
	return s.commitPlan(p)
}

func (s *Service) coordinate(ctx context.Context, members []mesh.Member) error {
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	cid := binary.BigEndian.Uint64(idb[:]) | 1
	p := bootstrap.NewPlan(cid, s.cfg.Shards, s.cfg.ReplicationFactor, s.cfg.TopLevel, members)
	raw, err := layout.Encode(p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ms := s.cfg.Methods
	var promised []mesh.Member
	var failed error
	for _, m := range members {
		if _, err := s.callFounder(ctx, m, ms.Prepare, raw); err != nil {
			failed = fmt.Errorf("peer %s refused plan: %w", m.Name, err)
			break
		}
		promised = append(promised, m)
	}
	if failed != nil {
		var cidb [8]byte
		binary.BigEndian.PutUint64(cidb[:], cid)
		for _, m := range promised {
			_, _ = s.callFounder(ctx, m, ms.Abort, cidb[:])
		}
		return failed
	}
	s.log.Info("forming cluster", "cluster", cid, "peers", len(members), "shards", p.Shards)
	for _, m := range members {
		if m.Name == s.cfg.Name {
			continue
		}
		if _, err := s.callFounder(ctx, m, ms.Commit, raw); err != nil {
			// It adopts the layout from a committed member once its promise lapses.
			s.log.Warn("commit not delivered", "peer", m.Name, "err", err)
		}
	}
	return s.commitPlan(p)
}

// callFounder calls m at its gossiped RPC address, or serves the call
// locally when m is this peer.
func (s *Service) callFounder(ctx context.Context, m mesh.Member, method uint8, body []byte) ([]byte, error) {
	if m.Name == s.cfg.Name {
		return s.ServeBootstrap(ctx, method, body)
	}
	return s.cfg.Peers.Call(ctx, m.Meta.RPCAddr, method, body)
}

// ServeBootstrap answers the bootstrap methods (Methods.Prepare, Commit
// and Abort, from founders that may not be members of anything yet, so
// the plan says who may call) and Methods.GetPlacement (node has checked
// that its caller is a known peer).
func (s *Service) ServeBootstrap(ctx context.Context, method uint8, body []byte) ([]byte, error) {
	ms := s.cfg.Methods
	switch method {
	case ms.GetPlacement:
		return s.currentPlacement(ctx, bytes.Equal(body, GetPlacementLinearizable))
	case ms.Abort:
		if len(body) != 8 {
			return nil, errors.New("abort: bad cluster id")
		}
		cid := binary.BigEndian.Uint64(body)
		s.bootMu.Lock()
		defer s.bootMu.Unlock()
		if promised := s.promises.PromiseFor(cid); promised != nil {
			if err := s.authorizeBootstrap(ctx, promised, "abort"); err != nil {
				return nil, err
			}
			s.promises.Abort(cid)
		}
		return nil, nil
	case ms.Prepare, ms.Commit:
	default:
		return nil, fmt.Errorf("unknown bootstrap method %d", method)
	}
	p, err := layout.Decode(body)
	if err != nil {
		return nil, err
	}
	// Authorized before anything about this peer is compared with the
	// plan, and the refusal names no NodeHostID: a stranger learnt a
	// joiner's from it, then sent the plan that captured the joiner.
	if method == ms.Prepare {
		err = s.authorizePrepare(ctx, p)
	} else {
		err = s.authorizeBootstrap(ctx, p, "commit")
	}
	if err != nil {
		return nil, err
	}
	if self, ok := p.Peer(s.cfg.Name); !ok || self.NodeHostID != s.replicas.ID() {
		return nil, lockerr.RPC(lockerr.CodeRejected, "the plan does not list peer %s with its NodeHostID", s.cfg.Name)
	}
	if method == ms.Prepare {
		s.bootMu.Lock()
		defer s.bootMu.Unlock()
		if s.placement.Load() != nil {
			return nil, lockerr.RPC(lockerr.CodeRejected, "peer %s already belongs to a cluster", s.cfg.Name)
		}
		if err := s.promises.Prepare(p, body, s.cfg.Now()); err != nil {
			return nil, lockerr.RPC(lockerr.CodeRejected, "peer %s promised another plan", s.cfg.Name)
		}
		s.adopting.Store(p) // its founders' Raft connections are expected
		return nil, nil
	}
	// Only the plan this peer promised: anyone else's commit, or one sent
	// to a joiner that promised nothing, would write a foreign cluster
	// into the data dir.
	s.bootMu.Lock()
	promised := s.promises.Promised()
	s.bootMu.Unlock()
	if cur := s.placement.Load(); cur == nil && !s.cfg.UnsafeNoAuthz {
		if err := authz.BootstrapCommit(promised, body); err != nil {
			return nil, s.peer.Refused(err)
		}
	}
	return nil, s.commitPlan(p)
}

// authorizePrepare applies authz.BootstrapPrepare: only a founder
// promises, and only a plan whose coordinator gossip shows free to found
// a cluster (MayFound), the caller itself when it has an identity.
func (s *Service) authorizePrepare(ctx context.Context, plan *layout.Placement) error {
	if s.cfg.UnsafeNoAuthz {
		return nil
	}
	free := func(pe layout.Peer) bool {
		m, ok := s.mesh.Member(pe.Name)
		return ok && bootstrap.MayFound(m) && m.Meta.NodeHostID == pe.NodeHostID
	}
	return s.peer.Refused(authz.BootstrapPrepare(s.peer.Caller(ctx), s.cfg.BootstrapExpect > 0, plan, free))
}

// authorizeBootstrap applies authz.BootstrapCall to a commit or abort:
// with identity, it comes from a founder plan lists.
func (s *Service) authorizeBootstrap(ctx context.Context, plan *layout.Placement, what string) error {
	if s.cfg.UnsafeNoAuthz {
		return nil
	}
	return s.peer.Refused(authz.BootstrapCall(s.peer.Caller(ctx), plan, what))
}

// commitPlan adopts p unless this peer already has a layout.
func (s *Service) commitPlan(p *layout.Placement) error {
	s.bootMu.Lock()
	defer s.bootMu.Unlock()
	if cur := s.placement.Load(); cur != nil {
		if cur.ClusterID != p.ClusterID {
			return lockerr.RPC(lockerr.CodeRejected, "peer %s already belongs to another cluster", s.cfg.Name)
		}
		return nil
	}
	s.promises.Settle()
	if err := s.peer.Adopt(p); err != nil {
		return err
	}
	if s.replicas.Hosts(layout.MetaShard) {
		s.peer.Go(func(ctx context.Context) { s.publishPlacement(ctx, p) })
	}
	return nil
}

// publishPlacement writes p into the meta shard (a no-op if a placement of
// the same or a later epoch is there), retrying until it lands or ctx, the
// peer's life, ends.
func (s *Service) publishPlacement(ctx context.Context, p *layout.Placement) {
	raw, err := layout.Encode(p)
	if err != nil {
		return
	}
	for attempt := 0; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout())
		_, err := s.nh.SyncPropose(pctx, s.nh.GetNoOPSession(layout.MetaShard), raw)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		if s.router.Backoff(ctx, attempt) != nil {
			return
		}
	}
}

// currentPlacement answers Methods.GetPlacement: the layout read through
// this peer's meta replica if it has one, else (unless linearizable: the
// body is GetPlacementLinearizable) this peer's own copy, which may be
// behind.
//
// A copy must not pass for a read: two peers whose meta replicas were both
// removed while they were cut off would each ask the other and adopt
// nothing newer than their own copies, for ever.
func (s *Service) currentPlacement(ctx context.Context, linearizable bool) ([]byte, error) {
	p := s.placement.Load()
	if p == nil {
		return nil, lockerr.RPC(lockerr.CodeNoCluster, "peer %s is not in a cluster yet", s.cfg.Name)
	}
	if s.replicas.Hosts(layout.MetaShard) {
		q, err := s.ReadLocalPlacement(ctx)
		if err == nil {
			return layout.Encode(q)
		}
		if linearizable {
			return nil, lockerr.RPC(lockerr.CodeBusy, "peer %s cannot read the layout from its meta replica: %v", s.cfg.Name, err)
		}
	} else if linearizable {
		return nil, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no meta replica", s.cfg.Name)
	}
	return layout.Encode(p)
}
