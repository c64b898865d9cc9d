package node

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// A replica that is sent a snapshot it cannot load halts instead of
// panicking the process (the peer plays a release that reads snapshot
// format 1 only): the shard goes on serving from the other replicas, the
// peer's other replicas and its callers go on, and once the peer is
// upgraded it loads the snapshot it kept and holds the same state as the
// others.
func TestReplicaHaltsOnSnapshotItCannotLoad(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, shards: 1, rf: 3})
	shard := layout.FirstLockShard
	old := peers[2]
	lockUnlock := func(p *testPeer, key string) {
		t.Helper()
		l, err := p.node.Lock(ctxT(t, 10*time.Second), key)
		if err != nil {
			t.Fatalf("%s: Lock %s: %v", p.cfg.Name, key, err)
		}
		if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
			t.Fatalf("%s: Unlock %s: %v", p.cfg.Name, key, err)
		}
	}
	lockUnlock(old, "before")
	lr, err := old.node.peer.NodeHost().GetLogReader(shard)
	if err != nil {
		t.Fatal(err)
	}
	_, oldLast := lr.GetRange()

	// While the peer is down, the others write, snapshot and compact
	// their logs past what it has, so it can only catch up from a
	// snapshot.
	old.node.Close()
	old.hooks.HoldSnapshot = 1
	for i := range 5 {
		lockUnlock(peers[i%2], fmt.Sprintf("while-down-%d", i))
	}
	snapshots := map[uint64]bool{}
	for _, p := range peers[:2] {
		idx, err := p.node.peer.NodeHost().SyncRequestSnapshot(ctxT(t, 10*time.Second), shard,
			dragonboat.SnapshotOption{OverrideCompactionOverhead: true, CompactionOverhead: 0})
		if err != nil {
			t.Fatalf("%s: snapshot: %v", p.cfg.Name, err)
		}
		snapshots[idx] = true
	}
	pollUntil(t, 20*time.Second, "logs compacted past the stopped peer's", func() bool {
		for _, p := range peers[:2] {
			lr, err := p.node.peer.NodeHost().GetLogReader(shard)
			if err != nil {
				return false
			}
			if first, _ := lr.GetRange(); first <= oldLast+1 {
				return false
			}
		}
		return true
	})

	old.start(t)
	old.waitReady(t)
	he := waitHalted(t, old.node, shard)
	if !he.Snapshot || he.Version != lockfsm.SnapshotVersion || !snapshots[he.Index] || !errors.Is(he, lockfsm.ErrVersion) {
		t.Fatalf("halted with %v (index %d, snapshot %t); want a halt at one of the snapshots %v", he, he.Index, he.Snapshot, snapshots)
	}
	for _, p := range peers[:2] {
		if he := p.node.peer.HaltedShard(shard); he != nil {
			t.Fatalf("%s halted too: %v", p.cfg.Name, he)
		}
	}
	if !old.node.peer.HostsShard(layout.MetaShard) {
		t.Fatal("the peer's meta replica stopped with its lock replica")
	}
	for _, p := range peers {
		lockUnlock(p, "after-halt")
	}

	// Restarted still not upgraded, the replica halts while it replays
	// the snapshot from its own data dir, during Start: the peer still
	// starts and serves, and Placement says which shard halted (issue 18:
	// Start failed).
	old.node.Close()
	old.start(t)
	old.waitReady(t)
	waitHalted(t, old.node, shard)
	infos, err := old.node.Placement(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		switch {
		case info.Shard == shard && (info.Halted == nil || !info.Halted.Snapshot):
			t.Fatalf("Placement after a restart reports shard %d halted as %v, want the snapshot halt", shard, info.Halted)
		case info.Shard != shard && info.Halted != nil:
			t.Fatalf("Placement reports shard %d halted too: %v", info.Shard, info.Halted)
		}
	}
	for _, p := range peers {
		lockUnlock(p, "after-restart")
	}

	// Upgraded, the peer loads the snapshot and catches up.
	old.node.Close()
	old.hooks.HoldSnapshot = 0
	old.start(t)
	old.waitReady(t)
	lockUnlock(old, "after-upgrade")
	waitConverged(t, peers, shard)
	if he := old.node.peer.HaltedShard(shard); he != nil {
		t.Fatalf("halted after the upgrade: %v", he)
	}
}
