package node

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// lockSM adapts lockfsm.State to dragonboat's IStateMachine. dragonboat
// holds a write lock around Update and Recover and a read lock around
// Lookup and SaveSnapshot, so the state needs no locking of its own.
type lockSM struct {
	shard   uint64
	state   *lockfsm.State
	onGrant func(shard uint64, grants []lockfsm.Grant)
	// onApply is testHooks.onApply; nil in production.
	onApply func(shard, index uint64, grants []lockfsm.Grant)
	// skipTermCheck is testHooks.unsafeSkipExpiryTerm: every ExpireSession
	// is stamped with the recorded term, so none is ever refused.
	skipTermCheck bool
	// maxFormat is the newest command format this replica reads:
	// lockfsm.Version, or older for a peer held at an older feature level.
	maxFormat byte
	// maxSnapshot, when not 0, is the newest snapshot format this replica
	// loads, older than lockfsm.SnapshotVersion: a peer held back by a test
	// (testHooks.holdSnapshot) to play an older release.
	maxSnapshot byte
	// snapshotFormat is the snapshot format to save in: the one of the
	// cluster's feature level (snapshotFormat of Node.clusterLevel), so
	// that any replica the snapshot is sent to can load it. nil saves
	// lockfsm.SnapshotVersion.
	snapshotFormat func() byte
	halt           halter
}

// resultHalted is the Value of an entry a replica did not apply because
// it halted at that entry or an earlier one; Data is the halt error.
const resultHalted = 0

func (s *lockSM) Update(e sm.Entry) (sm.Result, error) {
	if err := s.halt.err; err != nil {
		return sm.Result{Value: resultHalted, Data: []byte(err.Error())}, nil
	}
	cmds, err := s.decode(e.Cmd)
	if err != nil {
		err = s.halt.stop(s.shard, e, err)
		return sm.Result{Value: resultHalted, Data: []byte(err.Error())}, nil
	}
	if s.skipTermCheck {
		for i := range cmds {
			if cmds[i].Op == lockfsm.OpExpireSession {
				cmds[i].Term = s.state.Term()
			}
		}
	}
	results, grants := s.state.Apply(e.Index, cmds)
	if s.onApply != nil {
		s.onApply(s.shard, e.Index, grants)
	}
	data, err := lockfsm.EncodeResults(results)
	if err != nil {
		return sm.Result{}, fmt.Errorf("shard %d: encode results: %w", s.shard, err)
	}
	if s.onGrant != nil {
		// Grants at once answer their Acquire; only hand-offs must be
		// delivered to a waiter.
		var handOffs []lockfsm.Grant
		for _, g := range grants {
			if g.HandOff {
				handOffs = append(handOffs, g)
			}
		}
		if len(handOffs) > 0 {
			s.onGrant(s.shard, handOffs)
		}
	}
	return sm.Result{Value: uint64(len(results)), Data: data}, nil
}

func (s *lockSM) decode(cmd []byte) ([]lockfsm.Command, error) {
	if len(cmd) > 0 && cmd[0] > s.maxFormat {
		return nil, fmt.Errorf("%w: command format %d is newer than %d, the newest this peer is held to", lockfsm.ErrVersion, cmd[0], s.maxFormat)
	}
	return lockfsm.DecodeCommands(cmd)
}

// halter makes a replica fail-stop at the first entry or snapshot it
// cannot decode or does not understand. Skipping the entry would diverge
// from replicas that apply it; so the state machine applies nothing from
// there on, answers no reads, saves no snapshot (so the entry stays in the
// log), loads no later snapshot, and onStop stops the replica. A peer that
// can read the entry (an upgraded one) replays it from the log when it
// restarts; a snapshot it could not load stays in its data dir and is
// loaded at that start. dragonboat serialises Update, Lookup,
// SaveSnapshot and RecoverFromSnapshot with the state machine's lock, so
// err needs no lock of its own.
type halter struct {
	err *HaltError
	// onStop is called once, on dragonboat's apply or snapshot goroutine:
	// it must not block.
	onStop func(*HaltError)
	// snapshotIndex returns the log index of the snapshot being loaded,
	// for the halt error; nil, or 0, when it is not known.
	snapshotIndex func() uint64
}

func (h *halter) stop(shard uint64, e sm.Entry, cause error) *HaltError {
	h.err = &HaltError{Shard: shard, Index: e.Index, Err: cause}
	if len(e.Cmd) > 0 {
		h.err.Version = e.Cmd[0]
	}
	if h.onStop != nil {
		h.onStop(h.err)
	}
	return h.err
}

// stopSnapshot halts at a snapshot the replica cannot load: version is its
// first byte, cause why it does not load.
func (h *halter) stopSnapshot(shard uint64, version byte, cause error) *HaltError {
	h.err = &HaltError{Shard: shard, Version: version, Snapshot: true, Err: cause}
	if h.snapshotIndex != nil {
		h.err.Index = h.snapshotIndex()
	}
	if h.onStop != nil {
		h.onStop(h.err)
	}
	return h.err
}

// check returns, after a halt, the error that aborts a snapshot. It wraps
// sm.ErrSnapshotAborted alone: dragonboat tells an aborted save from a
// failed one (which panics the process) with cockroachdb/errors, whose Is
// follows only a single Unwrap chain, so the halt error is only text here.
func (h *halter) check() error {
	if h.err == nil {
		return nil
	}
	return fmt.Errorf("%w: %v", sm.ErrSnapshotAborted, h.err)
}

// stateReader, passed to Lookup, reads the state machine's state under
// dragonboat's read lock (tests compare replicas with it).
type stateReader func(*lockfsm.State) any

// lockQuery is what Lookup answers; exactly one kind is set.
type lockQuery struct {
	Kind    uint8  `msgpack:"k"`
	Session uint64 `msgpack:"s"`
	Req     uint64 `msgpack:"r"`
	Key     string `msgpack:"y"`
}

const (
	queryRequest uint8 = iota + 1
	queryKey
	querySessions
)

// lockAnswer is Lookup's reply to a lockQuery.
type lockAnswer struct {
	SessionFound bool                  `msgpack:"sf"`
	Request      lockfsm.RequestInfo   `msgpack:"rq"`
	KeyFound     bool                  `msgpack:"kf"`
	Key          lockfsm.KeyInfo       `msgpack:"ki"`
	Sessions     []lockfsm.SessionInfo `msgpack:"ss"`
	// Term is the leader term the state has recorded (querySessions).
	Term uint64 `msgpack:"t"`
}

func (s *lockSM) Lookup(q any) (any, error) {
	if err := s.halt.err; err != nil {
		return nil, err
	}
	if read, ok := q.(stateReader); ok {
		return read(s.state), nil
	}
	lq, ok := q.(lockQuery)
	if !ok {
		return nil, fmt.Errorf("shard %d: unknown query %T", s.shard, q)
	}
	var a lockAnswer
	switch lq.Kind {
	case queryRequest:
		a.Request, a.SessionFound = s.state.Request(lq.Session, lq.Req)
	case queryKey:
		a.Key, a.KeyFound = s.state.Key(lq.Key)
	case querySessions:
		a.Sessions, a.Term = s.state.Sessions(), s.state.Term()
	default:
		return nil, fmt.Errorf("shard %d: unknown query kind %d", s.shard, lq.Kind)
	}
	return a, nil
}

// SaveSnapshot writes the state in the snapshot format of the cluster's
// feature level. That level comes from the layout this peer holds, not
// from the replicated state, so replicas may save in different formats
// while a raise spreads; that is safe because every format a level writes
// is read by every release at that level and every later one, and a peer
// holds a level only after the meta shard committed it, which needs every
// peer of the layout to speak it. Snapshots need not be equal bytes across
// replicas: each replica saves its own, and only the state is compared.
func (s *lockSM) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	if err := s.halt.check(); err != nil {
		return err
	}
	format := byte(lockfsm.SnapshotVersion)
	if s.snapshotFormat != nil {
		format = max(s.snapshotFormat(), s.state.MinSnapshotFormat())
	}
	return s.state.SaveFormat(w, format)
}

// RecoverFromSnapshot loads a snapshot, or halts the replica when it
// cannot: a format newer than it reads, a shape it does not know, or a
// failed read. It returns nil either way, because dragonboat panics the
// whole process on any other error than sm.ErrSnapshotStopped, and takes
// that one for a recovery aborted by a stopping replica: its applied index
// stays before the snapshot, whose entries its log may no longer hold.
// With nil, dragonboat counts the snapshot as applied, and the halted
// state machine then answers as after an unreadable entry: Update applies
// nothing (resultHalted), Lookup fails with the HaltError, SaveSnapshot is
// aborted (so no snapshot of the state it does not have is ever written),
// and onStop stops the replica keeping its data. The snapshot stays in
// the data dir, and a peer that can read it loads it at its next start.
func (s *lockSM) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	if s.halt.err != nil {
		return nil // halted before: it loads nothing more
	}
	br := bufio.NewReader(r)
	var version byte
	if b, err := br.Peek(1); err == nil {
		version = b[0]
	}
	var err error
	if s.maxSnapshot != 0 && version > s.maxSnapshot {
		err = fmt.Errorf("%w: snapshot format %d is newer than %d, the newest this peer is held to", lockfsm.ErrVersion, version, s.maxSnapshot)
	} else {
		err = s.state.Load(br)
	}
	if err != nil {
		s.halt.stopSnapshot(s.shard, version, err)
	}
	return nil
}

func (s *lockSM) Close() error { return nil }

// metaSM is the meta shard's state machine: the latest placement, replaced
// only by its successor (epoch + 1). Its snapshots are written in the
// format of the level the placement records (metaSnapshotFormat), and one
// it cannot load halts it as lockSM.RecoverFromSnapshot does.
type metaSM struct {
	epoch     uint64
	placement []byte
	halt      halter
}

// metaHalted is the Value of a meta entry a halted replica did not apply.
const metaHalted = math.MaxUint64

func (m *metaSM) Update(e sm.Entry) (sm.Result, error) {
	if err := m.halt.err; err != nil {
		return sm.Result{Value: metaHalted, Data: []byte(err.Error())}, nil
	}
	p, err := layout.Decode(e.Cmd)
	if err != nil {
		// Proposers validate what they write, so a layout that does not
		// decode here was written by a release this one does not know.
		err = m.halt.stop(metaShardID, e, err)
		return sm.Result{Value: metaHalted, Data: []byte(err.Error())}, nil
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
			cur.Shards != p.Shards || cur.KeyScheme != p.KeyScheme || levelOf(p) < levelOf(cur)) {
			return sm.Result{Value: 0, Data: []byte("layout changes the cluster id, shards, key scheme or lowers the level")}, nil
		}
	}
	m.epoch = p.Epoch
	m.placement = append([]byte(nil), e.Cmd...)
	return sm.Result{Value: m.epoch}, nil
}

func (m *metaSM) Lookup(any) (any, error) {
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

// metaSnapshotFormat is the meta snapshot format a cluster at level writes.
// Releases before 0.2.0, which speak levels 1 and 2, read only version 1,
// so both levels write it; version 2 is written from level 3, which only
// releases that read it speak.
func metaSnapshotFormat(level uint8) byte {
	if level >= 3 {
		return metaSnapshotV2
	}
	return metaSnapshotV1
}

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
func (m *metaSM) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	if err := m.halt.check(); err != nil {
		return err
	}
	// m.placement decoded when it was applied or loaded; nil is level 1.
	p, _ := layout.Decode(m.placement)
	b, err := encodeMetaSnapshot(metaSnapshotFormat(levelOf(p)), m.epoch, m.placement)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// RecoverFromSnapshot loads a meta snapshot, or halts the replica on one
// it cannot load (an unknown snapshot or placement version, a shape it does
// not read, a failed read), returning nil as lockSM.RecoverFromSnapshot
// does and for the same reasons.
func (m *metaSM) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	if m.halt.err != nil {
		return nil // halted before: it loads nothing more
	}
	b, err := io.ReadAll(io.LimitReader(r, 1+metaSnapshotHeader+maxBodySize+1))
	var version byte
	if len(b) > 0 {
		version = b[0]
	}
	if err != nil {
		m.halt.stopSnapshot(metaShardID, version, fmt.Errorf("meta snapshot: %w", err))
		return nil
	}
	if len(b) > 1+metaSnapshotHeader+maxBodySize {
		m.halt.stopSnapshot(metaShardID, version, errors.New("meta snapshot: placement too large"))
		return nil
	}
	format, epoch, placement, err := decodeMetaSnapshot(b)
	if err != nil {
		m.halt.stopSnapshot(metaShardID, format, err)
		return nil
	}
	m.epoch, m.placement = epoch, placement
	return nil
}

func (m *metaSM) Close() error { return nil }
