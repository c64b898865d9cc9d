package peer

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// statusPeerTimeout bounds the wait for each peer's answer in Status.
const statusPeerTimeout = time.Second

// Reports are what the live peers of a layout said of their lock
// replicas (AskApplied): how far each has applied, and the leader each
// knows, by peer and shard.
type Reports struct {
	Applied map[string]map[uint64]uint64
	Leaders map[string]map[uint64]string // "" when the replica knows none
}

// AskApplied asks every live peer of layout p, this one included, how far
// its lock replicas have applied and whom they know to lead.
func (n *Peer) AskApplied(ctx context.Context, p *layout.Placement) Reports {
	out := Reports{Applied: map[string]map[uint64]uint64{n.cfg.Name: n.appliedIndexes()}, Leaders: map[string]map[uint64]string{}}
	own := map[uint64]string{}
	for _, ls := range n.LocalShards() {
		own[ls.Shard] = leaderName(p, ls.Shard, ls.Leader)
	}
	out.Leaders[n.cfg.Name] = own
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, pe := range p.Peers {
		if pe.Name == n.cfg.Name {
			continue
		}
		if _, ok := n.rpcAddr(pe.Name); !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, statusPeerTimeout)
			defer cancel()
			ps, err := n.membership.Status(cctx, pe.Name)
			if err != nil {
				return
			}
			leaders := map[uint64]string{}
			for shard := range ps.Replicas {
				leaders[shard] = leaderName(p, shard, ps.Leaders[shard])
			}
			mu.Lock()
			if ps.Applied != nil {
				out.Applied[pe.Name] = ps.Applied
			}
			out.Leaders[pe.Name] = leaders
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// leaderName names the peer of p that runs replica id of shard, the
// shard's leader as a replica reported it; "" for none (id 0) or a
// replica p does not list there.
func leaderName(p *layout.Placement, shard, id uint64) string {
	if id == 0 {
		return ""
	}
	name, _ := p.ReplicaPeer(shard, id)
	return name
}

// LocalShard is a lock shard this peer runs a replica of.
type LocalShard struct {
	Shard                uint64
	LeaderKnown, Leading bool
	Leader               uint64 // the leader's replica id; 0 when not known
}

// LocalShards lists the lock shards this peer runs replicas of.
func (n *Peer) LocalShards() []LocalShard {
	if n.replicas == nil {
		return nil
	}
	var out []LocalShard
	for shard, id := range n.replicas.Running() {
		if shard == metaShardID {
			continue
		}
		lid, ok := n.replicas.Leader(shard)
		if !ok {
			lid = 0
		}
		out = append(out, LocalShard{Shard: shard, LeaderKnown: ok, Leading: ok && lid == id, Leader: lid})
	}
	slices.SortFunc(out, func(a, b LocalShard) int { return cmp.Compare(a.Shard, b.Shard) })
	return out
}

// LocalCounts reads the counts of shard's state from this peer's replica
// as it is (not linearizable); ok is false when it runs none. It costs a
// pass over the shard's keys.
func (n *Peer) LocalCounts(shard uint64) (lockfsm.Stats, bool) {
	if shard == metaShardID || !n.HostsShard(shard) {
		return lockfsm.Stats{}, false
	}
	v, err := n.nh.StaleRead(shard, replica.StateReader(func(s *lockfsm.State) any { return s.Stats() }))
	if err != nil {
		return lockfsm.Stats{}, false
	}
	st, ok := v.(lockfsm.Stats)
	return st, ok
}

// appliedIndexes returns the last applied index of each lock replica this
// peer runs.
func (n *Peer) appliedIndexes() map[uint64]uint64 {
	out := map[uint64]uint64{}
	if n.replicas == nil {
		return out
	}
	for shard := range n.replicas.Running() {
		if shard == metaShardID {
			continue
		}
		v, err := n.nh.StaleRead(shard, replica.StateReader(func(s *lockfsm.State) any { return s.Index() }))
		if err != nil {
			continue
		}
		if i, ok := v.(uint64); ok {
			out[shard] = i
		}
	}
	return out
}
