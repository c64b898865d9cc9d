package replica

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	crdberrors "github.com/cockroachdb/errors"
	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// unreadable is a tagged Acquire with field tag 48, which no release knows.
var unreadable = []byte{lockfsm.FormatTagged, 0x91, 0x82, 0x01, byte(lockfsm.OpAcquire), 48, 0x01}

// A replica that meets an entry it cannot read stops there: it applies
// nothing after it, answers no reads and saves no snapshot, so the entry
// stays in the log for an upgraded peer to replay.
func TestLockHaltsOnUnreadableEntry(t *testing.T) {
	var stopped []*lockerr.HaltError
	s := NewLock(LockConfig{Shard: 5, MaxFormat: lockfsm.Version,
		Halt: Halter{OnStop: func(he *lockerr.HaltError) { stopped = append(stopped, he) }}})
	open, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}})
	if r, err := s.Update(sm.Entry{Index: 1, Cmd: open}); err != nil || r.Value != 1 {
		t.Fatalf("open session: %+v %v", r, err)
	}
	r, err := s.Update(sm.Entry{Index: 2, Cmd: unreadable})
	if err != nil || r.Value != ResultHalted {
		t.Fatalf("unreadable entry: %+v %v, want ResultHalted", r, err)
	}
	for _, want := range []string{"shard 5", "log index 2", "format version 3", "field tag 48", "upgrade this peer"} {
		if !strings.Contains(string(r.Data), want) {
			t.Errorf("halt error %q does not say %q", r.Data, want)
		}
	}
	if len(stopped) != 1 || stopped[0].Index != 2 || !errors.Is(stopped[0], lockerr.ReplicaHalted) || !errors.Is(stopped[0], lockfsm.ErrUnsupported) {
		t.Fatalf("OnStop calls: %v", stopped)
	}
	acquire, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpAcquire, Session: 1, Req: 1, Key: "k"}})
	if r, _ := s.Update(sm.Entry{Index: 3, Cmd: acquire}); r.Value != ResultHalted {
		t.Fatalf("entry after the halt: %+v, want ResultHalted", r)
	}
	if _, ok := s.state.Key("k"); ok || s.state.Index() != 1 {
		t.Fatalf("a halted replica applied an entry (index %d)", s.state.Index())
	}
	if _, err := s.Lookup(Query{Kind: QueryKey, Key: "k"}); !errors.Is(err, lockerr.ReplicaHalted) {
		t.Fatalf("Lookup on a halted replica: %v", err)
	}
	var buf bytes.Buffer
	err = s.SaveSnapshot(&buf, nil, nil)
	// dragonboat decides between "aborted" and "failed, panic" with
	// cockroachdb/errors, which follows only a single Unwrap chain.
	if !crdberrors.Is(err, sm.ErrSnapshotAborted) || buf.Len() != 0 {
		t.Fatalf("SaveSnapshot on a halted replica: %v (%d bytes); want ErrSnapshotAborted as dragonboat sees it", err, buf.Len())
	}
	if len(stopped) != 1 {
		t.Fatalf("OnStop called %d times", len(stopped))
	}
}

// A replica held to an older format halts on a newer one, as an older
// release's would.
func TestLockHeldToOlderFormat(t *testing.T) {
	s := NewLock(LockConfig{Shard: 2, MaxFormat: lockfsm.FormatPositional})
	cmd := []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}}
	old, _ := lockfsm.EncodeCommandsFormat(lockfsm.FormatPositional, cmd)
	if r, _ := s.Update(sm.Entry{Index: 1, Cmd: old}); r.Value != 1 {
		t.Fatalf("format 2 entry: %+v", r)
	}
	tagged, _ := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, cmd)
	if r, _ := s.Update(sm.Entry{Index: 2, Cmd: tagged}); r.Value != ResultHalted || !errors.Is(s.halt.err, lockfsm.ErrVersion) {
		t.Fatalf("format 3 entry on a replica held to 2: %+v, halt %v", r, s.halt.err)
	}
}

// lockSnapshot is the snapshot of a state with one open session.
func lockSnapshot(t *testing.T) []byte {
	t.Helper()
	s := NewLock(LockConfig{Shard: 3, MaxFormat: lockfsm.Version})
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
func TestLockHaltsOnUnreadableSnapshot(t *testing.T) {
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
			var stopped []*lockerr.HaltError
			s := NewLock(LockConfig{Shard: 5, MaxFormat: lockfsm.Version, MaxSnapshot: tc.maxSnapshot,
				Halt: Halter{OnStop: func(he *lockerr.HaltError) { stopped = append(stopped, he) }, SnapshotIndex: func() uint64 { return 42 }}})
			if err := s.RecoverFromSnapshot(bytes.NewReader(tc.snapshot), nil, nil); err != nil {
				t.Fatalf("RecoverFromSnapshot: %v; want nil (dragonboat panics on an error)", err)
			}
			if len(stopped) != 1 {
				t.Fatalf("OnStop calls: %v", stopped)
			}
			he := stopped[0]
			if !he.Snapshot || he.Shard != 5 || he.Index != 42 || he.Version != tc.wantVersion ||
				!errors.Is(he, lockerr.ReplicaHalted) || !errors.Is(he, tc.wantErr) {
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
			if r, err := s.Update(sm.Entry{Index: 50, Cmd: acquire}); err != nil || r.Value != ResultHalted {
				t.Fatalf("entry after the halt: %+v %v, want ResultHalted", r, err)
			}
			if _, err := s.Lookup(Query{Kind: QuerySessions}); !errors.Is(err, lockerr.ReplicaHalted) {
				t.Fatalf("Lookup: %v", err)
			}
			var buf bytes.Buffer
			if err := s.SaveSnapshot(&buf, nil, nil); !crdberrors.Is(err, sm.ErrSnapshotAborted) || buf.Len() != 0 {
				t.Fatalf("SaveSnapshot: %v (%d bytes); want ErrSnapshotAborted as dragonboat sees it", err, buf.Len())
			}
			// A later snapshot is not loaded: the replica stays halted.
			if err := s.RecoverFromSnapshot(bytes.NewReader(good), nil, nil); err != nil || s.state.Index() != 0 || len(stopped) != 1 {
				t.Fatalf("a later snapshot: %v, index %d, %d OnStop calls", err, s.state.Index(), len(stopped))
			}
		})
	}
}

// A readable snapshot loads, and a replica saves the format
// SnapshotFormat gives (node's snapshotFormat of the cluster's level,
// whose values node's tests check), which every release at that level
// reads, or the newer one its state needs: a session label exists only
// once level 3 is committed, even while this peer's view of the level
// still says 2.
func TestLockSavesTheLevelsSnapshotFormat(t *testing.T) {
	good := lockSnapshot(t)
	for _, format := range []byte{2, 3} {
		s := NewLock(LockConfig{Shard: 5, MaxFormat: lockfsm.Version,
			SnapshotFormat: func() byte { return format }})
		if err := s.RecoverFromSnapshot(bytes.NewReader(good), nil, nil); err != nil || s.halt.err != nil {
			t.Fatalf("RecoverFromSnapshot: %v, halt %v", err, s.halt.err)
		}
		var buf bytes.Buffer
		if err := s.SaveSnapshot(&buf, nil, nil); err != nil || buf.Bytes()[0] != format {
			t.Fatalf("format %d: SaveSnapshot after loading: %v, wrote format %d", format, err, buf.Bytes()[0])
		}
		r := lockfsm.New()
		if err := r.Load(&buf); err != nil || !reflect.DeepEqual(r.Sessions(), s.state.Sessions()) {
			t.Fatalf("format %d: the saved snapshot loads as %v, %+v", format, err, r.Sessions())
		}
	}

	s := NewLock(LockConfig{Shard: 5, MaxFormat: lockfsm.Version, SnapshotFormat: func() byte { return 2 }})
	s.state.Apply(1, []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000, Label: 9}})
	var buf bytes.Buffer
	if err := s.SaveSnapshot(&buf, nil, nil); err != nil || buf.Bytes()[0] != 3 {
		t.Fatalf("a labelled state asked for format 2: SaveSnapshot %v, format %d; want format 3", err, buf.Bytes()[0])
	}
}

// A LockConfig without a MaxFormat reads every format this release knows.
func TestLockZeroMaxFormatReadsTheNewest(t *testing.T) {
	s := NewLock(LockConfig{Shard: 2})
	tagged, _ := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}})
	if r, _ := s.Update(sm.Entry{Index: 1, Cmd: tagged}); r.Value != 1 || s.halt.err != nil {
		t.Fatalf("format 3 entry: %+v, halt %v", r, s.halt.err)
	}
}
