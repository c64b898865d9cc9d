package node

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// unreadable is a tagged Acquire with field tag 48, which no release knows.
var unreadable = []byte{lockfsm.FormatTagged, 0x91, 0x82, 0x01, byte(lockfsm.OpAcquire), 48, 0x01}

// A replica that meets an entry it cannot read stops there: it applies
// nothing after it, answers no reads and saves no snapshot, so the entry
// stays in the log for an upgraded peer to replay.
func TestLockSMHaltsOnUnreadableEntry(t *testing.T) {
	var stopped []*HaltError
	s := &lockSM{shard: 5, state: lockfsm.New(), maxFormat: lockfsm.Version,
		halt: halter{onStop: func(he *HaltError) { stopped = append(stopped, he) }}}
	open, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}})
	if r, err := s.Update(sm.Entry{Index: 1, Cmd: open}); err != nil || r.Value != 1 {
		t.Fatalf("open session: %+v %v", r, err)
	}
	r, err := s.Update(sm.Entry{Index: 2, Cmd: unreadable})
	if err != nil || r.Value != resultHalted {
		t.Fatalf("unreadable entry: %+v %v, want resultHalted", r, err)
	}
	for _, want := range []string{"shard 5", "log index 2", "format version 3", "field tag 48", "upgrade this peer"} {
		if !strings.Contains(string(r.Data), want) {
			t.Errorf("halt error %q does not say %q", r.Data, want)
		}
	}
	if len(stopped) != 1 || stopped[0].Index != 2 || !errors.Is(stopped[0], ErrReplicaHalted) || !errors.Is(stopped[0], lockfsm.ErrUnsupported) {
		t.Fatalf("onStop calls: %v", stopped)
	}
	acquire, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpAcquire, Session: 1, Req: 1, Key: "k"}})
	if r, _ := s.Update(sm.Entry{Index: 3, Cmd: acquire}); r.Value != resultHalted {
		t.Fatalf("entry after the halt: %+v, want resultHalted", r)
	}
	if _, ok := s.state.Key("k"); ok || s.state.Index() != 1 {
		t.Fatalf("a halted replica applied an entry (index %d)", s.state.Index())
	}
	if _, err := s.Lookup(lockQuery{Kind: queryKey, Key: "k"}); !errors.Is(err, ErrReplicaHalted) {
		t.Fatalf("Lookup on a halted replica: %v", err)
	}
	var buf bytes.Buffer
	if err := s.SaveSnapshot(&buf, nil, nil); !errors.Is(err, sm.ErrSnapshotAborted) || buf.Len() != 0 {
		t.Fatalf("SaveSnapshot on a halted replica: %v (%d bytes); want ErrSnapshotAborted, which dragonboat skips", err, buf.Len())
	}
	if len(stopped) != 1 {
		t.Fatalf("onStop called %d times", len(stopped))
	}
}

// A replica held to an older format halts on a newer one, as an older
// release's would.
func TestLockSMHeldToOlderFormat(t *testing.T) {
	s := &lockSM{shard: 2, state: lockfsm.New(), maxFormat: lockfsm.FormatPositional}
	cmd := []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}}
	old, _ := lockfsm.EncodeCommandsFormat(lockfsm.FormatPositional, cmd)
	if r, _ := s.Update(sm.Entry{Index: 1, Cmd: old}); r.Value != 1 {
		t.Fatalf("format 2 entry: %+v", r)
	}
	tagged, _ := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, cmd)
	if r, _ := s.Update(sm.Entry{Index: 2, Cmd: tagged}); r.Value != resultHalted || !errors.Is(s.halt.err, lockfsm.ErrVersion) {
		t.Fatalf("format 3 entry on a replica held to 2: %+v, halt %v", r, s.halt.err)
	}
}

// The meta shard halts the same way on a layout it cannot decode.
func TestMetaSMHaltsOnUnreadableLayout(t *testing.T) {
	m := &metaSM{}
	r, err := m.Update(sm.Entry{Index: 4, Cmd: []byte{9, 0x80}})
	if err != nil || r.Value != metaHalted || !strings.Contains(string(r.Data), "shard 1 stopped applying at log index 4 (entry format version 9)") {
		t.Fatalf("unreadable layout: %+v %v", r, err)
	}
	if _, err := m.Lookup(nil); !errors.Is(err, ErrReplicaHalted) {
		t.Fatalf("Lookup: %v", err)
	}
}

// In a cluster, an entry no replica can read halts the shard on every
// peer: no lock of that shard is granted from a state that skipped it,
// other shards go on, and a restarted peer halts again at the same index.
func TestReplicaStopsOnEntryItCannotDecode(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 3, shards: 2, rf: 3})
	p1 := peers[0].node
	keyOf := func(shard uint64) string {
		for i := 0; ; i++ {
			if k := fmt.Sprintf("key-%d", i); p1.placement.Load().ShardOf(k) == shard {
				return k
			}
		}
	}
	bad, good := layout.FirstLockShard, layout.FirstLockShard+1
	l, err := p1.Lock(ctxT(t, 10*time.Second), keyOf(bad))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctxT(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}

	r, err := p1.nh.SyncPropose(ctxT(t, 10*time.Second), p1.nh.GetNoOPSession(bad), unreadable)
	if err != nil || r.Value != resultHalted {
		t.Fatalf("proposing an unreadable entry: %+v %v", r, err)
	}
	var index uint64
	for _, p := range peers {
		he := waitHalted(t, p.node, bad)
		if index == 0 {
			index = he.Index
		}
		if he.Index != index || he.Version != lockfsm.FormatTagged || !errors.Is(he, lockfsm.ErrUnsupported) {
			t.Fatalf("%s halted with %v, want index %d", p.cfg.Name, he, index)
		}
	}

	if _, err := p1.TryLock(ctxT(t, 2*time.Second), keyOf(bad)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryLock on the halted shard: %v, want ErrUnavailable", err)
	}
	if l, err := peers[1].node.Lock(ctxT(t, 10*time.Second), keyOf(good)); err != nil {
		t.Fatalf("Lock on a healthy shard: %v", err)
	} else {
		_ = l.Unlock(ctxT(t, 10*time.Second))
	}

	// The same release restarted cannot read the entry either: it halts at
	// the same index instead of skipping it.
	p1.Close()
	peers[0].start(t)
	peers[0].waitReady(t)
	if he := waitHalted(t, peers[0].node, bad); he.Index != index {
		t.Fatalf("after restart halted at %d, want %d", he.Index, index)
	}
}

func waitHalted(t *testing.T, n *Node, shard uint64) *HaltError {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if he := n.haltedShard(shard); he != nil && !n.hostsShard(shard) {
			return he
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: replica of shard %d did not halt", n.cfg.Name, shard)
	return nil
}
