package peer

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
// DeadlockProbe or longer reads every shard's wait graph (QueryWaits, a
// ReadIndex read through each shard's leader) and plays them together
// (lockfsm.StuckWaits). For a stuck wait of its own that the play names
// the victim of its cycle, it reads the graphs a second time, after the
// first round is complete, and refuses the wait (lockerr.Deadlock, naming the
// cycle) only if the second play names it too and, at every step of the
// cycle, the key has the same holders, and the same waiters up to the
// step's waiter, in both rounds. An attempt is waiting, then held, then
// done, and never comes back, and a queue keeps its order: so a step seen
// alike in two reads held throughout the time between them, and the cycle
// existed whole at the instant between the rounds, although the shards
// were read at different times. Waiters that join a queue behind the
// cycle change nothing. Every peer picks the same victim from the same
// graphs, so one wait of a cycle is refused, not one per peer.
//
// A wait is refused once it has waited DeadlockProbe, within one more
// probe and two rounds of reads: about a second on a healthy cluster,
// two at most while every shard answers. A shard that does not answer, or
// whose waiters and holders pass replica.MaxWaitAttempts, puts the check
// off to the next probe.
const DeadlockProbe = 500 * time.Millisecond

// deadlockLoop checks this peer's long flagged waits every deadlockProbe.
func (n *Peer) deadlockLoop() {
	t := time.NewTicker(DeadlockProbe)
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
func (n *Peer) checkCrossShard(ctx context.Context) int {
	waits := n.client.Waits().Older(time.Now().Add(-DeadlockProbe))
	if len(waits) == 0 || !n.ClusterLevel().HasLockFamily() {
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
	for _, st := range n.stuckWaits(first) {
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
	for _, st := range n.stuckWaits(second) {
		if st.Victim {
			again[waiterOf(st)] = st
		}
	}
	refused := 0
	for _, v := range victims {
		st, ok := again[waiterOf(v)]
		if !ok || st.Why != v.Why || !sameSteps(first, second, v.Steps) {
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

// stuckWaits is lockfsm.StuckWaits over graphs other peers answered. It
// is fuzzed with such graphs (FuzzStuckWaits); should a graph still make
// it panic, this peer logs it and finds nothing, rather than crash.
func (n *Peer) stuckWaits(graphs []lockfsm.ShardWaits) (stuck []lockfsm.StuckWait) {
	defer func() {
		if r := recover(); r != nil {
			n.log.Error("the cross-shard deadlock check failed on the shards' wait graphs; no wait refused", "panic", r)
			stuck = nil
		}
	}()
	return lockfsm.StuckWaits(graphs)
}

func waiterOf(st lockfsm.StuckWait) client.WaiterKey {
	return client.WaiterKey{Shard: st.Shard, Session: st.Waiter.Session, Req: st.Waiter.Req}
}

// readWaitGraphs reads every lock shard's wait graph; ok is false when a
// shard did not answer or answered only part of its graph.
func (n *Peer) readWaitGraphs(ctx context.Context) (graphs []lockfsm.ShardWaits, ok bool) {
	p := n.placement.Load()
	if p == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(ctx, DeadlockProbe)
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

// sameSteps reports whether, at each step of a cycle, the key has the
// same holders, and the same waiters up to the step's waiter, in both
// reads.
func sameSteps(a, b []lockfsm.ShardWaits, steps []lockfsm.CycleStep) bool {
	find := func(gs []lockfsm.ShardWaits, st lockfsm.CycleStep) (holders, ahead []lockfsm.WaitAttempt, ok bool) {
		for _, g := range gs {
			if g.Shard != st.Shard {
				continue
			}
			for _, k := range g.Keys {
				if k.Key != st.Key {
					continue
				}
				for i, w := range k.Waiters {
					if w.Session == st.Session && w.Req == st.Req {
						return k.Holders, k.Waiters[:i+1], true
					}
				}
			}
		}
		return nil, nil, false
	}
	for _, st := range steps {
		h1, w1, ok1 := find(a, st)
		h2, w2, ok2 := find(b, st)
		if !ok1 || !ok2 || !reflect.DeepEqual(h1, h2) || !reflect.DeepEqual(w1, w2) {
			return false
		}
	}
	return true
}
