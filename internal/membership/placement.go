package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/router"
)

// ReadPlacement reads the layout from the meta shard, linearizably.
//
// The local meta replica answers when this peer has one and it is caught
// up. A replica still joining cannot, nor can one removed from the shard
// while this peer was cut off (it never hears of its removal), so the meta
// hosts of this peer's copy of the layout are asked next, each to read
// through its own meta replica. If that copy is so old that none of them
// hosts one any more, the peers it lists are asked for their copies, and
// the meta hosts of the newest are asked in turn.
func (s *Service) ReadPlacement(ctx context.Context) (*layout.Placement, error) {
	var lastErr error = lockerr.NotReady
	if s.replicas.Hosts(layout.MetaShard) {
		// A short try: a replica that is still joining, or was just
		// removed from the shard, would spend the whole budget waiting.
		lctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout()/2)
		p, err := s.ReadLocalPlacement(lctx)
		cancel()
		if err == nil {
			return p, nil
		}
		lastErr = err
	}
	p := s.placement.Load()
	if p == nil {
		return nil, lockerr.NotReady
	}
	asked := map[string]bool{s.cfg.Name: true}
	errAsked := errors.New("asked already")
	ask := func(hosts []string) *layout.Placement {
		var q *layout.Placement
		err := s.router.TryHosts(ctx, router.Tries{
			Shard:  layout.MetaShard,
			Rounds: 1,
			Hosts:  func(int) []string { return hosts },
			Call: func(ctx context.Context, h string) error {
				if asked[h] || ctx.Err() != nil {
					return errAsked
				}
				asked[h] = true
				raw, err := s.peer.Call(ctx, h, s.cfg.Methods.GetPlacement, GetPlacementLinearizable)
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
	if q := ask(p.HostNames(layout.MetaShard)); q != nil {
		return q, nil
	}
	newest := p
	for _, pe := range p.Peers {
		if pe.Name == s.cfg.Name || ctx.Err() != nil {
			continue
		}
		raw, err := s.peer.Call(ctx, pe.Name, s.cfg.Methods.GetPlacement, nil)
		if err != nil {
			continue
		}
		if q, err := layout.Decode(raw); err == nil && q.ClusterID == p.ClusterID && q.Epoch > newest.Epoch {
			newest = q
		}
	}
	if q := ask(newest.HostNames(layout.MetaShard)); q != nil {
		return q, nil
	}
	return nil, lastErr
}

// ReadLocalPlacement reads the layout through this peer's meta replica,
// linearizably.
func (s *Service) ReadLocalPlacement(ctx context.Context) (*layout.Placement, error) {
	rctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout())
	defer cancel()
	v, err := s.nh.SyncRead(rctx, layout.MetaShard, nil)
	if err != nil {
		return nil, err
	}
	raw, _ := v.([]byte)
	if len(raw) == 0 {
		return nil, lockerr.NotReady
	}
	return layout.Decode(raw)
}

// ProposePlacement writes q, the successor of the current layout, into the
// meta shard. It fails if another change got in first.
func (s *Service) ProposePlacement(ctx context.Context, q *layout.Placement) error {
	raw, err := layout.Encode(q)
	if err != nil {
		return err
	}
	if !s.replicas.Hosts(layout.MetaShard) {
		p := s.placement.Load()
		return s.router.TryHosts(ctx, router.Tries{
			Shard:  layout.MetaShard,
			Rounds: 1,
			// Not this peer: it is no meta host (its copy of the layout
			// lags the one that says so).
			Hosts: func(int) []string {
				return slices.DeleteFunc(p.HostNames(layout.MetaShard), func(h string) bool { return h == s.cfg.Name })
			},
			Call: func(ctx context.Context, h string) error {
				_, err := s.peer.Call(ctx, h, s.cfg.Methods.SetPlacement, raw)
				return err
			},
			NoneTried: lockerr.NotReady,
		})
	}
	pctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout())
	defer cancel()
	epoch, err := s.peer.ProposeLayout(pctx, raw)
	if err != nil {
		return err
	}
	if epoch != q.Epoch {
		return fmt.Errorf("layout changed concurrently: epoch %d was already written; will retry from the new layout", q.Epoch)
	}
	return nil
}

// RunPlacement keeps this peer's copy of the layout current and starts or
// stops local replicas to match it, every Interval until ctx ends.
func (s *Service) RunPlacement(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		cur := s.placement.Load()
		if cur == nil {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 2*s.router.ProposalTimeout())
		q, err := s.ReadPlacement(rctx)
		cancel()
		if err != nil || !supersedes(q, cur) {
			continue
		}
		if err := s.updatePlacement(ctx, q); err != nil {
			s.log.Warn("apply new layout", "epoch", q.Epoch, "err", err)
		}
	}
}

// supersedes reports whether q, a layout read from the meta shard, is to
// replace cur, this peer's copy: a later epoch of the same cluster.
func supersedes(q, cur *layout.Placement) bool {
	return q.Epoch > cur.Epoch && q.ClusterID == cur.ClusterID
}

// NoteShortfall tells the operator, through log, when shards run with
// fewer replicas than the replication factor (too few peers:
// ReplicationFactor above the peer count, or a dead peer not yet
// replaced), and when that ends. old is nil for the first layout.
func NoteShortfall(log *slog.Logger, old, q *layout.Placement) {
	short, fewest := q.ShortShards()
	was := 0
	if old != nil {
		was, _ = old.ShortShards()
	}
	switch {
	case short > 0 && (old == nil || short != was):
		log.Warn("shards have fewer replicas than the replication factor; they need more peers",
			"short_shards", short, "shards", len(q.ShardIDs()), "fewest_replicas", fewest,
			"replication_factor", q.RF, "peers", len(q.Peers))
	case short == 0 && was > 0:
		log.Info("every shard has its replication factor again", "replication_factor", q.RF)
	}
}

// updatePlacement adopts a newer layout: it records it, starts the replicas
// it adds here and stops the ones it removed from here (bounded by ctx). A
// layout that lists this peer's name under another NodeHostID (another
// peer runs under the same Name) is refused: its replicas for the name are
// not this peer's.
func (s *Service) updatePlacement(ctx context.Context, q *layout.Placement) error {
	if ie := q.CheckIdentity(s.cfg.Name, s.replicas.ID()); ie != nil {
		s.peer.RefuseLayout(ie)
		return ie
	}
	if err := s.peer.CheckLevel(q); err != nil {
		return err
	}
	if err := s.peer.SaveRecord(q); err != nil {
		return err
	}
	NoteShortfall(s.log, s.placement.Load(), q)
	s.placement.Store(q)
	for _, st := range replicaSteps(q, s.cfg.Name, s.replicas.Local) {
		if st.start {
			if err := s.peer.StartReplica(q, st.shard, st.replica); err != nil {
				s.log.Warn("start replica", "shard", st.shard, "err", err)
			}
		} else {
			// Its data goes too: the shard no longer lists it, and the
			// id is never used again.
			s.replicas.Remove(ctx, st.shard)
		}
	}
	return nil
}

// replicaStep starts this peer's replica of shard (start) or stops it.
type replicaStep struct {
	shard   uint64
	start   bool
	replica layout.Replica // the replica to start
}

// replicaSteps lists, in shard order, what brings the replicas peer name
// runs (local gives the id it runs of a shard) in line with layout q: a
// replica q lists and the peer does not run starts; one the peer runs that
// q does not list, or lists under another id, stops.
func replicaSteps(q *layout.Placement, name string, local func(shard uint64) (uint64, bool)) []replicaStep {
	var steps []replicaStep
	for _, shard := range q.ShardIDs() {
		r, listed := q.Replica(shard, name)
		id, running := local(shard)
		switch {
		case listed && !running:
			steps = append(steps, replicaStep{shard: shard, start: true, replica: r})
		case running && (!listed || r.ID != id):
			steps = append(steps, replicaStep{shard: shard})
		}
	}
	return steps
}

// drainStep is Leave's decision on layout p for the peer name: done once
// p no longer lists it or gives it no replica; otherwise mark is p's
// successor marking it draining, or nil when p marks it already.
func drainStep(p *layout.Placement, name string) (done bool, mark *layout.Placement) {
	pe, listed := p.Peer(name)
	if !listed || p.ReplicaCount(name) == 0 {
		return true, nil
	}
	if pe.Draining {
		return false, nil
	}
	q := p.Next()
	for i := range q.Peers {
		if q.Peers[i].Name == name {
			q.Peers[i].Draining = true
		}
	}
	return false, q
}

// Leave moves this peer's replicas and leaderships out: it marks the peer
// draining in the layout, waits until the layout gives it no replica (the
// cluster never drops below the replication factor, so this needs enough
// other peers) and then until this peer's copy has stopped the last one.
// If ctx ends first the peer stays draining, and Leave returns an error
// saying what the last attempt hit. The caller closes the peer after it.
func (s *Service) Leave(ctx context.Context) error {
	// last says why the newest attempt made no progress, for the error
	// Leave returns if ctx ends first.
	var last error
	for attempt := 0; ; attempt++ {
		p, err := s.ReadPlacement(ctx)
		if err != nil {
			last = fmt.Errorf("reading the layout: %w", err)
		} else {
			done, mark := drainStep(p, s.cfg.Name)
			if done {
				break
			}
			last = fmt.Errorf("layout epoch %d still gives this peer %d replicas", p.Epoch, p.ReplicaCount(s.cfg.Name))
			if mark != nil {
				if err := s.ProposePlacement(ctx, mark); err != nil {
					last = fmt.Errorf("marking this peer draining: %w", err)
				} else {
					s.log.Info("draining: replicas will move to other peers")
				}
			}
		}
		if err := s.router.Backoff(ctx, min(attempt, 4)); err != nil {
			return fmt.Errorf("leave: replicas not moved away in time (is there a peer to take them?): %w (last: %v)", err, last)
		}
	}
	// Wait for this peer's copy to drop the last replica too.
	for s.replicas.Count() > 0 {
		if err := s.router.Backoff(ctx, 2); err != nil {
			return fmt.Errorf("leave: %w", err)
		}
	}
	return nil
}
