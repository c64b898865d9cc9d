package node

import (
	"errors"
	"testing"
	"time"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

// TestUnsafeSkipEntriesRecoversAShard: an entry no release reads, once
// committed, halts every replica of its shard, and again at every
// restart (the entry stays in the log). Restarting every peer with the
// entry in UnsafeSkipEntries brings the shard back, with its locks and
// tokens: the next grant's token is above every earlier one.
//
// The entry gets into the log the way the Raft review forced it, a Propose
// to a replica with the Raft filter off; with the filter on, no sender can
// propose it (TestRaftPortLocalProcess).
func TestUnsafeSkipEntriesRecoversAShard(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, mutate: restartable(t),
		hook: func(h *testHooks) { h.unsafeNoRaftFilter = true }})
	p := peers[0].node.placement.Load()
	shard := p.ShardIDs()[1]
	key := keyOnShard(p, shard, "recovery")
	l, err := peers[0].node.Lock(ctxT(t, 10*time.Second), key)
	if err != nil {
		t.Fatal(err)
	}
	before := l.Token()
	if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}

	f := raftForger{t: t}
	for _, x := range raftTargets(peers, "nobody") {
		if x.shard == shard {
			f.send(x.peer, pb.Message{Type: pb.Propose, ShardID: shard, To: x.to, From: x.from,
				Entries: []pb.Entry{{Type: pb.EncodedEntry, ClientID: 12345, Key: 7, Cmd: []byte{0, 0xc1, 0xc1}}}})
		}
	}
	index := waitAllHalted(t, peers, shard)

	// A restart replays the entry and halts there again.
	for _, pe := range peers {
		pe.hooks.unsafeNoRaftFilter = false
	}
	restartAll(t, peers)
	if got := waitAllHalted(t, peers, shard); got != index {
		t.Fatalf("halted at index %d after a restart, %d before", got, index)
	}

	for _, pe := range peers {
		pe.cfg.UnsafeSkipEntries = []LogEntry{{Shard: shard, Index: index}}
	}
	restartAll(t, peers)
	for _, pe := range peers {
		if err := pe.node.WaitServing(ctxT(t, 20*time.Second)); err != nil {
			t.Fatalf("%s: %v", pe.cfg.Name, err)
		}
	}
	for _, pe := range peers {
		l, err := pe.node.Lock(ctxT(t, 20*time.Second), key)
		if err != nil {
			t.Fatalf("%s: lock %q after the skip: %v", pe.cfg.Name, key, err)
		}
		if l.Token() <= before {
			t.Fatalf("%s: token %d after the skip, not above %d before it", pe.cfg.Name, l.Token(), before)
		}
		before = l.Token()
		if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	for _, pe := range peers {
		if he := pe.node.haltedShard(shard); he != nil {
			t.Fatalf("%s: halted after the skip: %v", pe.cfg.Name, he)
		}
	}
}

// waitAllHalted waits until every peer's replica of shard has halted and
// returns the index they halted at, which must be the same.
func waitAllHalted(t *testing.T, peers []*testPeer, shard uint64) uint64 {
	t.Helper()
	var index uint64
	pollUntil(t, 20*time.Second, "every replica of the shard to halt at the unreadable entry", func() bool {
		index = 0
		for _, pe := range peers {
			he := pe.node.haltedShard(shard)
			if he == nil || (index != 0 && he.Index != index) {
				return false
			}
			index = he.Index
		}
		return true
	})
	return index
}

func TestUnsafeSkipEntriesValidated(t *testing.T) {
	ok := testConfig(t, "p", clusterOpts{expect: 1})
	ok.UnsafeSkipEntries = []LogEntry{{Shard: 2, Index: 4}, {Shard: 3, Index: 4}}
	if err := ok.validate(true); err != nil {
		t.Fatalf("two shards' entries: %v", err)
	}
	for _, skip := range [][]LogEntry{{{Shard: 0, Index: 4}}, {{Shard: 2, Index: 0}}, {{Shard: 2, Index: 4}, {Shard: 2, Index: 9}}} {
		cfg := testConfig(t, "p", clusterOpts{expect: 1})
		cfg.UnsafeSkipEntries = skip
		if err := cfg.validate(true); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("UnsafeSkipEntries %v: %v, want ErrInvalidConfig", skip, err)
		}
	}
}
