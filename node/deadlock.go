package node

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Cross-shard deadlocks. Each shard refuses a wait that closes a cycle
// within it (lockfsm.FlagDeadlock); a cycle through keys of two shards is
// seen by neither. A peer whose Sessions have waited with the flag for
// deadlockProbe or longer reads every shard's wait graph (QueryWaits, a
// ReadIndex read through each shard's leader) and plays them together
// (lockfsm.StuckWaits). For a stuck wait of its own that the play names
// the victim of its cycle, it reads the graphs a second time, after the
// first round is complete, and refuses the wait (ErrDeadlock, naming the
// cycle) only if the second play names it too and every key of the cycle
// has the same holders and waiters in both rounds. An attempt is waiting,
// then held, then done, never back, and a queue only loses its head or
// grows at its tail: so a cycle seen unchanged in two reads existed, whole,
// at the instant between the rounds, although the shards were read at
// different times. Every peer picks the same victim from the same graphs,
// so one wait of a cycle is refused, not one per peer.
//
// A wait is refused within deadlockProbe of waiting deadlockProbe, plus
// two rounds of reads: about a second on a healthy cluster.
const deadlockProbe = 500 * time.Millisecond

// deadlockLoop checks this peer's long flagged waits every deadlockProbe.
func (n *Node) deadlockLoop() {
	t := time.NewTicker(deadlockProbe)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		n.checkCrossShard(n.ctx)
	}
}

// checkCrossShard refuses this peer's waits that are the victims of
// cross-shard cycles, and returns how many it refused.
func (n *Node) checkCrossShard(ctx context.Context) int {
	waits := n.client.Waits().Older(time.Now().Add(-deadlockProbe))
	if len(waits) == 0 || !n.labels() {
		return 0
	}
	mine := map[client.WaiterKey]bool{}
	for _, w := range waits {
		mine[w.WaiterKey] = true
	}
	n.deadlockChecks.Add(1)
	first, ok := n.readWaitGraphs(ctx)
	if !ok {
		return 0
	}
	var victims []lockfsm.StuckWait
	for _, st := range lockfsm.StuckWaits(first) {
		if st.Victim && mine[waiterOf(st)] {
			victims = append(victims, st)
		}
	}
	if len(victims) == 0 {
		return 0
	}
	second, ok := n.readWaitGraphs(ctx)
	if !ok {
		return 0
	}
	again := map[client.WaiterKey]lockfsm.StuckWait{}
	for _, st := range lockfsm.StuckWaits(second) {
		if st.Victim {
			again[waiterOf(st)] = st
		}
	}
	refused := 0
	for _, v := range victims {
		st, ok := again[waiterOf(v)]
		if !ok || st.Why != v.Why || !sameKeys(first, second, v.Keys) {
			continue
		}
		err := fmt.Errorf("lock %q: %w: waiting would deadlock across shards: %s", v.Key, lockerr.Deadlock, v.Why)
		if n.client.Waits().Refuse(waiterOf(v), err) {
			refused++
			n.log.Info("refused a wait that closed a cross-shard deadlock", "key", v.Key, "shard", v.Shard, "cycle", v.Why)
		}
	}
	return refused
}

func waiterOf(st lockfsm.StuckWait) client.WaiterKey {
	return client.WaiterKey{Shard: st.Shard, Session: st.Waiter.Session, Req: st.Waiter.Req}
}

// readWaitGraphs reads every lock shard's wait graph; ok is false when a
// shard did not answer or answered only part of its graph.
func (n *Node) readWaitGraphs(ctx context.Context) (graphs []lockfsm.ShardWaits, ok bool) {
	p := n.placement.Load()
	if p == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, deadlockProbe)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	ok = true
	for _, shard := range p.ShardIDs() {
		if shard == metaShardID {
			continue
		}
		wg.Go(func() {
			a, err := n.router.ReadRetrying(ctx, shard, replica.Query{Kind: replica.QueryWaits})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || !a.WaitsComplete {
				ok = false
				return
			}
			graphs = append(graphs, lockfsm.ShardWaits{Shard: shard, Keys: a.Waits})
		})
	}
	wg.Wait()
	return graphs, ok
}

// sameKeys reports whether each of keys has the same holders and waiters
// in both reads.
func sameKeys(a, b []lockfsm.ShardWaits, keys []lockfsm.ShardKey) bool {
	find := func(gs []lockfsm.ShardWaits, k lockfsm.ShardKey) *lockfsm.WaitKey {
		for _, g := range gs {
			if g.Shard != k.Shard {
				continue
			}
			for i := range g.Keys {
				if g.Keys[i].Key == k.Key {
					return &g.Keys[i]
				}
			}
		}
		return nil
	}
	for _, k := range keys {
		x, y := find(a, k), find(b, k)
		if x == nil || y == nil || !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}
