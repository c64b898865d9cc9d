package node

import (
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
	halt      halter
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

// halter makes a replica fail-stop at the first entry it cannot decode or
// does not understand. Skipping the entry would diverge from replicas that
// apply it; so the state machine applies nothing from there on, answers
// no reads, saves no snapshot (so the entry stays in the log), and onStop
// stops the replica. A peer that can read the entry (an upgraded one)
// replays it from the log when it restarts. dragonboat serialises Update,
// Lookup and SaveSnapshot with the state machine's lock, so err needs no
// lock of its own.
type halter struct {
	err    *HaltError
	onStop func(*HaltError) // called once, on the apply goroutine: must not block
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

func (s *lockSM) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	if err := s.halt.check(); err != nil {
		return err
	}
	return s.state.Save(w)
}

func (s *lockSM) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	return s.state.Load(r)
}

func (s *lockSM) Close() error { return nil }

// metaSM is the meta shard's state machine: the latest placement, replaced
// only by its successor (epoch + 1).
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

func (m *metaSM) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
	if err := m.halt.check(); err != nil {
		return err
	}
	var hdr [12]byte
	binary.BigEndian.PutUint64(hdr[:8], m.epoch)
	binary.BigEndian.PutUint32(hdr[8:], uint32(len(m.placement)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(m.placement)
	return err
}

func (m *metaSM) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
	var hdr [12]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[8:])
	if n > maxBodySize {
		return errors.New("meta snapshot: placement too large")
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return err
	}
	m.epoch, m.placement = binary.BigEndian.Uint64(hdr[:8]), buf
	return nil
}

func (m *metaSM) Close() error { return nil }
