package node

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	crdberrors "github.com/cockroachdb/errors"
	"github.com/lni/dragonboat/v4"
	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// lockSnapshot is the snapshot of a state with one open session.
func lockSnapshot(t *testing.T) []byte {
	t.Helper()
	s := &lockSM{shard: 3, state: lockfsm.New(), maxFormat: lockfsm.Version}
	open, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}})
	if r, err := s.Update(sm.Entry{Index: 1, Cmd: open}); err != nil || r.Value != 1 {
		t.Fatalf("open session: %+v %v", r, err)
	}
	var buf bytes.Buffer
	if err := s.SaveSnapshot(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A snapshot a replica cannot load halts it as an unreadable entry does,
// and RecoverFromSnapshot returns nil: any other error than
// sm.ErrSnapshotStopped makes dragonboat panic the process.
func TestLockSMHaltsOnUnreadableSnapshot(t *testing.T) {
	good := lockSnapshot(t)
	newer := slices.Clone(good)
	newer[0] = lockfsm.SnapshotVersion + 1
	for _, tc := range []struct {
		name        string
		snapshot    []byte
		maxSnapshot byte // 0: this release
		wantVersion byte
		wantErr     error
		wantText    string
	}{
		{"newer version", newer, 0, lockfsm.SnapshotVersion + 1, lockfsm.ErrVersion,
			fmt.Sprintf("got version %d, this release reads 1 to %d", lockfsm.SnapshotVersion+1, lockfsm.SnapshotVersion)},
		{"unknown shape", append(slices.Clone(good), 0x00), 0, lockfsm.SnapshotVersion, lockfsm.ErrCorrupt, "snapshot"},
		{"truncated", good[:len(good)/2], 0, lockfsm.SnapshotVersion, lockfsm.ErrCorrupt, "snapshot"},
		{"held to an older release", good, 1, lockfsm.SnapshotVersion, lockfsm.ErrVersion,
			fmt.Sprintf("snapshot format %d is newer than 1, the newest this peer is held to", lockfsm.SnapshotVersion)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stopped []*HaltError
			s := &lockSM{shard: 5, state: lockfsm.New(), maxFormat: lockfsm.Version, maxSnapshot: tc.maxSnapshot,
				halt: halter{onStop: func(he *HaltError) { stopped = append(stopped, he) }, snapshotIndex: func() uint64 { return 42 }}}
			if err := s.RecoverFromSnapshot(bytes.NewReader(tc.snapshot), nil, nil); err != nil {
				t.Fatalf("RecoverFromSnapshot: %v; want nil (dragonboat panics on an error)", err)
			}
			if len(stopped) != 1 {
				t.Fatalf("onStop calls: %v", stopped)
			}
			he := stopped[0]
			if !he.Snapshot || he.Shard != 5 || he.Index != 42 || he.Version != tc.wantVersion ||
				!errors.Is(he, ErrReplicaHalted) || !errors.Is(he, tc.wantErr) {
				t.Fatalf("halt error %+v (%v)", he, he)
			}
			for _, want := range []string{"shard 5 could not load the snapshot at log index 42", "upgrade this peer", tc.wantText} {
				if !strings.Contains(he.Error(), want) {
					t.Errorf("halt error %q does not say %q", he, want)
				}
			}
			if s.state.Index() != 0 {
				t.Fatalf("the state changed to index %d", s.state.Index())
			}

			// From here it answers as after an unreadable entry.
			acquire, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "b", TTLMillis: 1000}})
			if r, err := s.Update(sm.Entry{Index: 50, Cmd: acquire}); err != nil || r.Value != resultHalted {
				t.Fatalf("entry after the halt: %+v %v, want resultHalted", r, err)
			}
			if _, err := s.Lookup(lockQuery{Kind: querySessions}); !errors.Is(err, ErrReplicaHalted) {
				t.Fatalf("Lookup: %v", err)
			}
			var buf bytes.Buffer
			if err := s.SaveSnapshot(&buf, nil, nil); !crdberrors.Is(err, sm.ErrSnapshotAborted) || buf.Len() != 0 {
				t.Fatalf("SaveSnapshot: %v (%d bytes); want ErrSnapshotAborted as dragonboat sees it", err, buf.Len())
			}
			// A later snapshot is not loaded: the replica stays halted.
			if err := s.RecoverFromSnapshot(bytes.NewReader(good), nil, nil); err != nil || s.state.Index() != 0 || len(stopped) != 1 {
				t.Fatalf("a later snapshot: %v, index %d, %d onStop calls", err, s.state.Index(), len(stopped))
			}
		})
	}
}

// A readable snapshot loads, and a replica saves the format of the
// cluster's level, which every release at that level reads, or the newer
// one its state needs: a session label exists only once level 3 is
// committed, even while this peer's view of the level still says 2.
func TestLockSMSavesTheLevelsSnapshotFormat(t *testing.T) {
	for level, want := range map[uint8]byte{1: 2, 2: 2, 3: 3} {
		if f := snapshotFormat(level); f != want {
			t.Errorf("level %d writes snapshot format %d, want %d: releases at levels 1 and 2 read only formats 1 and 2", level, f, want)
		}
	}
	good := lockSnapshot(t)
	for level := minLevel; level <= maxLevel; level++ {
		s := &lockSM{shard: 5, state: lockfsm.New(), maxFormat: lockfsm.Version,
			snapshotFormat: func() byte { return snapshotFormat(level) }}
		if err := s.RecoverFromSnapshot(bytes.NewReader(good), nil, nil); err != nil || s.halt.err != nil {
			t.Fatalf("RecoverFromSnapshot: %v, halt %v", err, s.halt.err)
		}
		var buf bytes.Buffer
		if err := s.SaveSnapshot(&buf, nil, nil); err != nil || buf.Bytes()[0] != snapshotFormat(level) {
			t.Fatalf("level %d: SaveSnapshot after loading: %v, format %d", level, err, buf.Bytes()[0])
		}
		r := lockfsm.New()
		if err := r.Load(&buf); err != nil || !reflect.DeepEqual(r.Sessions(), s.state.Sessions()) {
			t.Fatalf("level %d: the saved snapshot loads as %v, %+v", level, err, r.Sessions())
		}
	}

	s := &lockSM{shard: 5, state: lockfsm.New(), maxFormat: lockfsm.Version,
		snapshotFormat: func() byte { return snapshotFormat(2) }}
	s.state.Apply(1, []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000, Label: 9}})
	var buf bytes.Buffer
	if err := s.SaveSnapshot(&buf, nil, nil); err != nil || buf.Bytes()[0] != 3 {
		t.Fatalf("a labelled state at level 2: SaveSnapshot %v, format %d; want format 3", err, buf.Bytes()[0])
	}
}

// metaPlacement is an encoded valid layout at epoch 1.
func metaPlacement(t *testing.T) []byte {
	t.Helper()
	p := layout.New(7, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: "id-a"}})
	b, err := layout.Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// oldMetaSnapshot is what releases before the meta snapshot's version byte
// wrote: [epoch][n][placement].
func oldMetaSnapshot(epoch uint64, placement []byte) []byte {
	var hdr [12]byte
	binary.BigEndian.PutUint64(hdr[:8], epoch)
	binary.BigEndian.PutUint32(hdr[8:], uint32(len(placement)))
	return append(hdr[:], placement...)
}

// The meta snapshot round-trips in both formats; the levels this release
// speaks write version 1, byte for byte what earlier releases wrote and
// read; and a version-1 snapshot from an earlier release still loads.
func TestMetaSnapshotRoundTrip(t *testing.T) {
	placement := metaPlacement(t)
	m := &metaSM{}
	if r, _ := m.Update(sm.Entry{Index: 3, Cmd: placement}); r.Value != 1 {
		t.Fatalf("apply layout: %+v", r)
	}
	var buf bytes.Buffer
	if err := m.SaveSnapshot(&buf, nil, nil); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), oldMetaSnapshot(1, placement)) {
		t.Fatalf("a level-1 meta snapshot is not the version-1 shape earlier releases read: % x", buf.Bytes())
	}
	for level, want := range map[uint8]byte{1: metaSnapshotV1, 2: metaSnapshotV1, 3: metaSnapshotV2} {
		if f := metaSnapshotFormat(level); f != want {
			t.Errorf("level %d writes meta snapshot version %d, want %d: releases at levels 1 and 2 read only version 1", level, f, want)
		}
	}
	// A layout at level 3 is saved in version 2 and loads back.
	p3 := layout.New(7, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: "id-a"}})
	p3.Level = 3
	placement3, err := layout.Encode(p3)
	if err != nil {
		t.Fatal(err)
	}
	m3 := &metaSM{}
	if r, _ := m3.Update(sm.Entry{Index: 3, Cmd: placement3}); r.Value != 1 {
		t.Fatalf("apply a level-3 layout: %+v", r)
	}
	var buf3 bytes.Buffer
	if err := m3.SaveSnapshot(&buf3, nil, nil); err != nil || buf3.Bytes()[0] != metaSnapshotV2 {
		t.Fatalf("a level-3 layout's meta snapshot: %v, first byte %d; want version %d", err, buf3.Bytes()[0], metaSnapshotV2)
	}
	r3 := &metaSM{}
	if err := r3.RecoverFromSnapshot(bytes.NewReader(buf3.Bytes()), nil, nil); err != nil || r3.halt.err != nil || !bytes.Equal(r3.placement, placement3) || r3.epoch != 1 {
		t.Fatalf("the version-2 meta snapshot loads as %v, halt %v, epoch %d", err, r3.halt.err, r3.epoch)
	}

	v2, err := encodeMetaSnapshot(metaSnapshotV2, 1, placement)
	if err != nil {
		t.Fatal(err)
	}
	if v2[0] != metaSnapshotV2 || !bytes.Equal(v2[1:], oldMetaSnapshot(1, placement)) {
		t.Fatalf("version 2 is not its version byte then version 1's fields: % x", v2)
	}
	for _, tc := range []struct {
		name     string
		snapshot []byte
		epoch    uint64
		want     []byte
	}{
		{"version 1, as saved", buf.Bytes(), 1, placement},
		{"version 1, from an earlier release", oldMetaSnapshot(1, placement), 1, placement},
		{"version 1, empty", oldMetaSnapshot(0, nil), 0, nil},
		{"version 2", v2, 1, placement},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stopped []*HaltError
			r := &metaSM{halt: halter{onStop: func(he *HaltError) { stopped = append(stopped, he) }}}
			if err := r.RecoverFromSnapshot(bytes.NewReader(tc.snapshot), nil, nil); err != nil || len(stopped) != 0 {
				t.Fatalf("RecoverFromSnapshot: %v, halts %v", err, stopped)
			}
			if r.epoch != tc.epoch || !bytes.Equal(r.placement, tc.want) {
				t.Fatalf("loaded epoch %d, placement % x", r.epoch, r.placement)
			}
			got, err := r.Lookup(nil)
			if err != nil || !bytes.Equal(got.([]byte), tc.want) {
				t.Fatalf("Lookup: %v", err)
			}
		})
	}
}

// A meta snapshot of an unknown version, with a placement of an unknown
// version, or of a shape this release does not read halts the replica.
func TestMetaSMHaltsOnUnreadableSnapshot(t *testing.T) {
	placement := metaPlacement(t)
	newerPlacement := slices.Clone(placement)
	newerPlacement[0] = 9
	v2, _ := encodeMetaSnapshot(metaSnapshotV2, 1, placement)
	for _, tc := range []struct {
		name        string
		snapshot    []byte
		wantVersion byte
		wantText    string
	}{
		{"unknown version", append([]byte{3}, v2[1:]...), 3, "meta snapshot: unknown version 3"},
		{"version byte 1", append([]byte{1}, v2[1:]...), 1, "meta snapshot: unknown version 1"},
		{"unknown placement version in version 1", oldMetaSnapshot(1, newerPlacement), metaSnapshotV1, "placement: unknown version 9"},
		{"unknown placement version in version 2", append([]byte{metaSnapshotV2}, oldMetaSnapshot(1, newerPlacement)...), metaSnapshotV2, "placement: unknown version 9"},
		{"trailing bytes", append(oldMetaSnapshot(1, placement), 0), metaSnapshotV1, "follow"},
		{"truncated", v2[:8], metaSnapshotV2, "shorter than its header"},
		{"empty", nil, 0, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stopped []*HaltError
			m := &metaSM{halt: halter{onStop: func(he *HaltError) { stopped = append(stopped, he) }}}
			if r, _ := m.Update(sm.Entry{Index: 3, Cmd: placement}); r.Value != 1 {
				t.Fatalf("apply layout: %+v", r)
			}
			if err := m.RecoverFromSnapshot(bytes.NewReader(tc.snapshot), nil, nil); err != nil {
				t.Fatalf("RecoverFromSnapshot: %v; want nil (dragonboat panics on an error)", err)
			}
			if len(stopped) != 1 || !stopped[0].Snapshot || stopped[0].Shard != metaShardID || stopped[0].Version != tc.wantVersion ||
				!errors.Is(stopped[0], ErrReplicaHalted) || !strings.Contains(stopped[0].Error(), tc.wantText) {
				t.Fatalf("halts %v, want one at snapshot version %d saying %q", stopped, tc.wantVersion, tc.wantText)
			}
			if m.epoch != 1 || !bytes.Equal(m.placement, placement) {
				t.Fatalf("the halted replica changed its state to epoch %d", m.epoch)
			}
			if _, err := m.Lookup(nil); !errors.Is(err, ErrReplicaHalted) {
				t.Fatalf("Lookup: %v", err)
			}
			next := layout.New(7, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: "id-a"}})
			next.Epoch = 2
			b, _ := layout.Encode(next)
			if r, _ := m.Update(sm.Entry{Index: 4, Cmd: b}); r.Value != metaHalted {
				t.Fatalf("entry after the halt: %+v", r)
			}
			var buf bytes.Buffer
			if err := m.SaveSnapshot(&buf, nil, nil); !crdberrors.Is(err, sm.ErrSnapshotAborted) || buf.Len() != 0 {
				t.Fatalf("SaveSnapshot: %v", err)
			}
		})
	}
}

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
	lr, err := old.node.nh.GetLogReader(shard)
	if err != nil {
		t.Fatal(err)
	}
	_, oldLast := lr.GetRange()

	// While the peer is down, the others write, snapshot and compact
	// their logs past what it has, so it can only catch up from a
	// snapshot.
	old.node.Close()
	old.hooks.holdSnapshot = 1
	for i := range 5 {
		lockUnlock(peers[i%2], fmt.Sprintf("while-down-%d", i))
	}
	snapshots := map[uint64]bool{}
	for _, p := range peers[:2] {
		idx, err := p.node.nh.SyncRequestSnapshot(ctxT(t, 10*time.Second), shard,
			dragonboat.SnapshotOption{OverrideCompactionOverhead: true, CompactionOverhead: 0})
		if err != nil {
			t.Fatalf("%s: snapshot: %v", p.cfg.Name, err)
		}
		snapshots[idx] = true
	}
	pollUntil(t, 20*time.Second, "logs compacted past the stopped peer's", func() bool {
		for _, p := range peers[:2] {
			lr, err := p.node.nh.GetLogReader(shard)
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
		if he := p.node.haltedShard(shard); he != nil {
			t.Fatalf("%s halted too: %v", p.cfg.Name, he)
		}
	}
	if !old.node.hostsShard(metaShardID) {
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
	old.hooks.holdSnapshot = 0
	old.start(t)
	old.waitReady(t)
	lockUnlock(old, "after-upgrade")
	waitConverged(t, peers, shard)
	if he := old.node.haltedShard(shard); he != nil {
		t.Fatalf("halted after the upgrade: %v", he)
	}
}
