package node

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/peer"
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
		hook: func(h *peer.Hooks) { h.UnsafeNoRaftFilter = true }})
	p := peers[0].node.peer.Placement()
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

	// A Propose to the leader's replica, sent again if a leadership move
	// dropped it: more than one may commit, and the recovery below lists
	// every entry a replica halts at, as the operator would.
	forge := func() {
		for _, x := range raftTargets(peers, "nobody") {
			if x.shard == shard && x.peer.node.leadsShard(shard) {
				raftForger{t: t}.send(x.peer, pb.Message{Type: pb.Propose, ShardID: shard, To: x.to, From: x.from,
					Entries: []pb.Entry{{Type: pb.EncodedEntry, ClientID: 12345, Key: 7, Cmd: []byte{0, 0xc1, 0xc1}}}})
				return
			}
		}
	}
	var sent time.Time
	pollUntil(t, 20*time.Second, "the forged entry to halt a replica", func() bool {
		for _, pe := range peers {
			if pe.node.peer.HaltedShard(shard) != nil {
				return true
			}
		}
		if time.Since(sent) > 2*time.Second {
			forge()
			sent = time.Now()
		}
		return false
	})
	index := waitAllHalted(t, peers, shard)

	// A restart replays the entry and halts there again.
	for _, pe := range peers {
		pe.hooks.UnsafeNoRaftFilter = false
	}
	restartAll(t, peers)
	if got := waitAllHalted(t, peers, shard); got != index {
		t.Fatalf("halted at index %d after a restart, %d before", got, index)
	}

	// Skip what halts the replicas, until none does: each round lists the
	// index they name.
	var skip []LogEntry
	for round := 0; ; round++ {
		skip = append(skip, LogEntry{Shard: shard, Index: index})
		for _, pe := range peers {
			pe.cfg.UnsafeSkipEntries = skip
		}
		restartAll(t, peers)
		if err := waitServingOrHalted(t, peers, shard); err == nil {
			break
		} else if round == 2 {
			t.Fatalf("still halted after skipping %v: %v", skip, err)
		}
		index = waitAllHalted(t, peers, shard)
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
		if he := pe.node.peer.HaltedShard(shard); he != nil {
			t.Fatalf("%s: halted after the skip: %v", pe.cfg.Name, he)
		}
	}
}

// waitServingOrHalted waits until every peer serves every shard (nil), or
// a replica of shard halts (its error).
func waitServingOrHalted(t *testing.T, peers []*testPeer, shard uint64) error {
	t.Helper()
	var halted error
	pollUntil(t, 30*time.Second, "every peer to serve, or a replica to halt", func() bool {
		for _, pe := range peers {
			if he := pe.node.peer.HaltedShard(shard); he != nil {
				halted = he
				return true
			}
		}
		for _, pe := range peers {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			err := pe.node.WaitServing(ctx)
			cancel()
			if err != nil {
				return false
			}
		}
		return true
	})
	return halted
}

// waitAllHalted waits until every peer's replica of shard has halted and
// returns the index they halted at, which must be the same.
func waitAllHalted(t *testing.T, peers []*testPeer, shard uint64) uint64 {
	t.Helper()
	var index uint64
	pollUntil(t, 20*time.Second, "every replica of the shard to halt at the unreadable entry", func() bool {
		index = 0
		for _, pe := range peers {
			he := pe.node.peer.HaltedShard(shard)
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
	ok.UnsafeSkipEntries = []LogEntry{{Shard: 2, Index: 4}, {Shard: 3, Index: 4}, {Shard: 2, Index: 9}}
	if err := ok.validate(true); err != nil {
		t.Fatalf("entries of two shards, two of one: %v", err)
	}
	for _, skip := range [][]LogEntry{{{Shard: 0, Index: 4}}, {{Shard: 2, Index: 0}}} {
		cfg := testConfig(t, "p", clusterOpts{expect: 1})
		cfg.UnsafeSkipEntries = skip
		if err := cfg.validate(true); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("UnsafeSkipEntries %v: %v, want ErrInvalidConfig", skip, err)
		}
	}
}
