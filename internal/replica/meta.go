package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/msgcheck"
)

// Meta is the meta shard's state machine: the latest placement, replaced
// only by its successor (epoch + 1). Its snapshots are written in the
// format of the level the placement records (level.Level.MetaSnapshotFormat), and one
// it cannot load halts it as Lock.RecoverFromSnapshot does.
type Meta struct {
	epoch     uint64
	placement []byte
	halt      Halter
}

// NewMeta returns the state machine of a new meta replica, with no
// placement yet, halting through its own copy of halt.
func NewMeta(halt Halter) *Meta { return &Meta{halt: halt} }

// MetaHalted is the Value of a meta entry a halted replica did not apply.
const MetaHalted = math.MaxUint64

// Update applies an encoded placement: its Value is the new epoch, 0 when
// the placement was refused (not derived from the current one, or it
// changes what may not change), or MetaHalted.
func (m *Meta) Update(e sm.Entry) (sm.Result, error) {
	if err := m.halt.err; err != nil {
		return sm.Result{Value: MetaHalted, Data: []byte(err.Error())}, nil
	}
	p, err := layout.Decode(e.Cmd)
	if err != nil && m.halt.skips(layout.MetaShard, e, err) {
		return sm.Result{Value: 0}, nil // as a refused layout: nothing changes
	}
	if err != nil {
		// Proposers validate what they write, so a layout that does not
		// decode here was written by a release this one does not know.
		err = m.halt.stop(layout.MetaShard, e, err)
		return sm.Result{Value: MetaHalted, Data: []byte(err.Error())}, nil
	}
	// Compare-and-set: a layout replaces the current one only if it was
	// derived from it, so concurrent writers (the controller, a draining
	// peer) never lose each other's changes; the loser reads and retries.
	if p.Epoch != m.epoch+1 {
		return sm.Result{Value: 0}, nil // rejected: not derived from the current layout
	}
	// What keys map to never changes, and the level never goes down: a
	// writer that would change them (a release that does not know the
	// fields) is refused.
	if len(m.placement) > 0 {
		if cur, err := layout.Decode(m.placement); err == nil && (cur.ClusterID != p.ClusterID ||
			cur.Shards != p.Shards || cur.KeyScheme != p.KeyScheme || layout.LevelOf(p) < layout.LevelOf(cur)) {
			return sm.Result{Value: 0, Data: []byte("layout changes the cluster id, shards, key scheme or lowers the level")}, nil
		}
	}
	m.epoch = p.Epoch
	m.placement = append([]byte(nil), e.Cmd...)
	return sm.Result{Value: m.epoch}, nil
}

// Lookup returns a copy of the encoded placement (nil before the first),
// or the *lockerr.HaltError of a halted replica.
func (m *Meta) Lookup(any) (any, error) {
	if err := m.halt.err; err != nil {
		return nil, err
	}
	return append([]byte(nil), m.placement...), nil
}

// Meta snapshot formats. Both hold the epoch and the encoded placement
// (layout.Encode, with its own version byte), big endian:
//
//	version 1: [epoch uint64][n uint32][placement, n bytes]
//	version 2: [2][epoch uint64][n uint32][placement, n bytes]
//
// Version 1, from before meta snapshots had a version byte, is told from
// the others by its first byte, the top byte of the epoch: 0 for every
// epoch below 2^56, and the epoch grows by one per committed layout, so it
// never gets there. Every later version starts with its version byte,
// which is never 0, so a first byte of 0 is version 1, one of a version
// this release knows is that version, and any other is a newer format the
// replica halts on (or a version-1 snapshot whose epoch passed 2^56, which
// no cluster reaches).
const (
	metaSnapshotV1 byte = 1
	metaSnapshotV2 byte = 2
	// metaSnapshotHeader is the size of version 1's epoch and length.
	metaSnapshotHeader = 12
)

// encodeMetaSnapshot is the meta snapshot of epoch and placement in
// format.
func encodeMetaSnapshot(format byte, epoch uint64, placement []byte) ([]byte, error) {
	var b []byte
	switch format {
	case metaSnapshotV1:
		if epoch>>56 != 0 {
			return nil, fmt.Errorf("meta snapshot: epoch %d does not fit version 1", epoch)
		}
	case metaSnapshotV2:
		b = append(b, metaSnapshotV2)
	default:
		return nil, fmt.Errorf("meta snapshot: format %d, this release writes %d and %d", format, metaSnapshotV1, metaSnapshotV2)
	}
	b = binary.BigEndian.AppendUint64(b, epoch)
	b = binary.BigEndian.AppendUint32(b, uint32(len(placement)))
	return append(b, placement...), nil
}

// decodeMetaSnapshot reads a meta snapshot of any format this release
// knows, returning its format, epoch and placement. The placement must
// decode (layout.Decode): one of an unknown layout version, or that this
// release finds invalid, was written by a newer release.
func decodeMetaSnapshot(b []byte) (format byte, epoch uint64, placement []byte, err error) {
	if len(b) == 0 {
		return 0, 0, nil, errors.New("meta snapshot: empty")
	}
	body := b
	switch b[0] {
	case 0:
		format = metaSnapshotV1
	case metaSnapshotV2:
		format, body = metaSnapshotV2, b[1:]
	default:
		return b[0], 0, nil, fmt.Errorf("meta snapshot: unknown version %d, this release reads %d and %d (written by a newer release? upgrade this peer)",
			b[0], metaSnapshotV1, metaSnapshotV2)
	}
	if len(body) < metaSnapshotHeader {
		return format, 0, nil, fmt.Errorf("meta snapshot: version %d: %d bytes, shorter than its header", format, len(b))
	}
	epoch = binary.BigEndian.Uint64(body[:8])
	n := binary.BigEndian.Uint32(body[8:metaSnapshotHeader])
	if uint64(n) != uint64(len(body)-metaSnapshotHeader) {
		return format, 0, nil, fmt.Errorf("meta snapshot: version %d: placement of %d bytes, %d follow", format, n, len(body)-metaSnapshotHeader)
	}
	placement = body[metaSnapshotHeader:]
	if len(placement) > 0 {
		if _, err := layout.Decode(placement); err != nil {
			return format, 0, nil, fmt.Errorf("meta snapshot: version %d: %w", format, err)
		}
	} else if epoch != 0 {
		return format, 0, nil, fmt.Errorf("meta snapshot: version %d: epoch %d without a placement", format, epoch)
	}
	return format, epoch, placement, nil
}

// SaveSnapshot writes the epoch and placement in the format of the level
// the placement records: replicated state, so every replica picks the same.
func (m *Meta) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	if err := m.halt.check(); err != nil {
		return err
	}
	// m.placement decoded when it was applied or loaded; nil is level 1.
	p, _ := layout.Decode(m.placement)
	b, err := encodeMetaSnapshot(layout.LevelOf(p).MetaSnapshotFormat(), m.epoch, m.placement)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// RecoverFromSnapshot loads a meta snapshot, or halts the replica on one
// it cannot load (an unknown snapshot or placement version, a shape it does
// not read, a failed read), returning nil as Lock.RecoverFromSnapshot
// does and for the same reasons.
func (m *Meta) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	if m.halt.err != nil {
		return nil // halted before: it loads nothing more
	}
	b, err := io.ReadAll(io.LimitReader(r, 1+metaSnapshotHeader+msgcheck.MaxBody+1))
	var version byte
	if len(b) > 0 {
		version = b[0]
	}
	if err != nil {
		m.halt.stopSnapshot(layout.MetaShard, version, fmt.Errorf("meta snapshot: %w", err))
		return nil
	}
	if len(b) > 1+metaSnapshotHeader+msgcheck.MaxBody {
		m.halt.stopSnapshot(layout.MetaShard, version, errors.New("meta snapshot: placement too large"))
		return nil
	}
	format, epoch, placement, err := decodeMetaSnapshot(b)
	if err != nil {
		m.halt.stopSnapshot(layout.MetaShard, format, err)
		return nil
	}
	m.epoch, m.placement = epoch, placement
	return nil
}

// Close releases nothing: the placement is in memory.
func (m *Meta) Close() error { return nil }
