package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	crdberrors "github.com/cockroachdb/errors"
	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
)

// The meta shard halts the same way on a layout it cannot decode.
func TestMetaHaltsOnUnreadableLayout(t *testing.T) {
	m := NewMeta(Halter{})
	r, err := m.Update(sm.Entry{Index: 4, Cmd: []byte{9, 0x80}})
	if err != nil || r.Value != MetaHalted || !strings.Contains(string(r.Data), "shard 1 stopped applying at log index 4 (entry format version 9)") {
		t.Fatalf("unreadable layout: %+v %v", r, err)
	}
	if _, err := m.Lookup(nil); !errors.Is(err, lockerr.ReplicaHalted) {
		t.Fatalf("Lookup: %v", err)
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

// The meta snapshot round-trips in both formats; levels 1 and 2 write
// version 1, byte for byte what earlier releases wrote and read, and level
// 3 version 2; and a version-1 snapshot from an earlier release still loads.
func TestMetaSnapshotRoundTrip(t *testing.T) {
	placement := metaPlacement(t)
	m := NewMeta(Halter{})
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
	// The levels this release speaks (level.Min to level.Max).
	for level, want := range map[level.Level]byte{1: metaSnapshotV1, 2: metaSnapshotV1, 3: metaSnapshotV2} {
		if f := level.MetaSnapshotFormat(); f != want {
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
	m3 := NewMeta(Halter{})
	if r, _ := m3.Update(sm.Entry{Index: 3, Cmd: placement3}); r.Value != 1 {
		t.Fatalf("apply a level-3 layout: %+v", r)
	}
	var buf3 bytes.Buffer
	if err := m3.SaveSnapshot(&buf3, nil, nil); err != nil || buf3.Bytes()[0] != metaSnapshotV2 {
		t.Fatalf("a level-3 layout's meta snapshot: %v, first byte %d; want version %d", err, buf3.Bytes()[0], metaSnapshotV2)
	}
	r3 := NewMeta(Halter{})
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
			var stopped []*lockerr.HaltError
			r := NewMeta(Halter{OnStop: func(he *lockerr.HaltError) { stopped = append(stopped, he) }})
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
func TestMetaHaltsOnUnreadableSnapshot(t *testing.T) {
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
			var stopped []*lockerr.HaltError
			m := NewMeta(Halter{OnStop: func(he *lockerr.HaltError) { stopped = append(stopped, he) }})
			if r, _ := m.Update(sm.Entry{Index: 3, Cmd: placement}); r.Value != 1 {
				t.Fatalf("apply layout: %+v", r)
			}
			if err := m.RecoverFromSnapshot(bytes.NewReader(tc.snapshot), nil, nil); err != nil {
				t.Fatalf("RecoverFromSnapshot: %v; want nil (dragonboat panics on an error)", err)
			}
			if len(stopped) != 1 || !stopped[0].Snapshot || stopped[0].Shard != layout.MetaShard || stopped[0].Version != tc.wantVersion ||
				!errors.Is(stopped[0], lockerr.ReplicaHalted) || !strings.Contains(stopped[0].Error(), tc.wantText) {
				t.Fatalf("halts %v, want one at snapshot version %d saying %q", stopped, tc.wantVersion, tc.wantText)
			}
			if m.epoch != 1 || !bytes.Equal(m.placement, placement) {
				t.Fatalf("the halted replica changed its state to epoch %d", m.epoch)
			}
			if _, err := m.Lookup(nil); !errors.Is(err, lockerr.ReplicaHalted) {
				t.Fatalf("Lookup: %v", err)
			}
			next := layout.New(7, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: "id-a"}})
			next.Epoch = 2
			b, _ := layout.Encode(next)
			if r, _ := m.Update(sm.Entry{Index: 4, Cmd: b}); r.Value != MetaHalted {
				t.Fatalf("entry after the halt: %+v", r)
			}
			var buf bytes.Buffer
			if err := m.SaveSnapshot(&buf, nil, nil); !crdberrors.Is(err, sm.ErrSnapshotAborted) || buf.Len() != 0 {
				t.Fatalf("SaveSnapshot: %v", err)
			}
		})
	}
}
