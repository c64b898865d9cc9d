package replica

import (
	"bufio"
	"fmt"
	"io"
	"sync/atomic"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// LockConfig is what node gives the state machine of its replica of a
// lock shard. The funcs are called on dragonboat's apply and snapshot
// goroutines and must not block.
type LockConfig struct {
	Shard uint64
	// OnGrant receives the hand-offs an applied entry made (the grants
	// that passed a key on to a waiter), to deliver them; nil: none.
	OnGrant func(shard uint64, grants []lockfsm.Grant)
	// OnApply is node's testHooks.onApply; nil in production.
	OnApply func(shard, index uint64, grants []lockfsm.Grant)
	// SkipTermCheck is node's testHooks.unsafeSkipExpiryTerm: every
	// ExpireSession is stamped with the recorded term, so none is ever
	// refused.
	SkipTermCheck bool
	// MaxFormat is the newest command format this replica reads:
	// lockfsm.Version (0 reads as that), or older for a peer held at an
	// older feature level.
	MaxFormat byte
	// MaxSnapshot, when not 0, is the newest snapshot format this replica
	// loads, older than lockfsm.SnapshotVersion: a peer held back by a test
	// (node's testHooks.holdSnapshot) to play an older release.
	MaxSnapshot byte
	// SnapshotFormat is the snapshot format to save in: the one of the
	// cluster's feature level (node's snapshotFormat of its clusterLevel),
	// so that any replica the snapshot is sent to can load it. nil saves
	// lockfsm.SnapshotVersion.
	SnapshotFormat func() byte
	// Halt is this replica's Halter; the state machine keeps its own copy.
	Halt Halter
	// Counts, when not nil, counts the entries and commands applied; the
	// peer's replicas share one.
	Counts *Counts
}

// Counts are counters of what a peer's lock replicas applied, shared by
// them and safe for concurrent use.
type Counts struct {
	// Entries is the Raft entries applied, Commands the commands in them:
	// Commands/Entries is how many commands an entry carries on average.
	Entries, Commands atomic.Uint64
}

// Lock adapts lockfsm.State to dragonboat's IStateMachine: the state
// machine of a lock shard's replica. dragonboat holds a write lock around
// Update and Recover and a read lock around Lookup and SaveSnapshot, so
// the state needs no locking of its own.
type Lock struct {
	shard          uint64
	state          *lockfsm.State
	onGrant        func(shard uint64, grants []lockfsm.Grant)
	onApply        func(shard, index uint64, grants []lockfsm.Grant)
	skipTermCheck  bool
	maxFormat      byte
	maxSnapshot    byte
	snapshotFormat func() byte
	halt           Halter
	counts         *Counts
}

// NewLock returns the state machine of a new replica of cfg.Shard, with an
// empty state: dragonboat fills it from the snapshot and log it holds.
func NewLock(cfg LockConfig) *Lock {
	maxFormat := cfg.MaxFormat
	if maxFormat == 0 {
		maxFormat = lockfsm.Version
	}
	return &Lock{shard: cfg.Shard, state: lockfsm.New(), onGrant: cfg.OnGrant,
		onApply: cfg.OnApply, skipTermCheck: cfg.SkipTermCheck,
		maxFormat: maxFormat, maxSnapshot: cfg.MaxSnapshot,
		snapshotFormat: cfg.SnapshotFormat, halt: cfg.Halt, counts: cfg.Counts}
}

// ResultHalted is the Value of an entry a lock replica did not apply
// because it halted at that entry or an earlier one; Data is the halt
// error.
const ResultHalted = 0

// Update applies entry e: its Value is the number of results in Data
// (lockfsm.EncodeResults), or ResultHalted.
func (s *Lock) Update(e sm.Entry) (sm.Result, error) {
	if err := s.halt.err; err != nil {
		return sm.Result{Value: ResultHalted, Data: []byte(err.Error())}, nil
	}
	cmds, err := s.decode(e.Cmd)
	if err != nil {
		err = s.halt.stop(s.shard, e, err)
		return sm.Result{Value: ResultHalted, Data: []byte(err.Error())}, nil
	}
	if s.skipTermCheck {
		for i := range cmds {
			if cmds[i].Op == lockfsm.OpExpireSession {
				cmds[i].Term = s.state.Term()
			}
		}
	}
	results, grants := s.state.Apply(e.Index, cmds)
	if s.counts != nil {
		s.counts.Entries.Add(1)
		s.counts.Commands.Add(uint64(len(cmds)))
	}
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

func (s *Lock) decode(cmd []byte) ([]lockfsm.Command, error) {
	if len(cmd) > 0 && cmd[0] > s.maxFormat {
		return nil, fmt.Errorf("%w: command format %d is newer than %d, the newest this peer is held to", lockfsm.ErrVersion, cmd[0], s.maxFormat)
	}
	return lockfsm.DecodeCommands(cmd)
}

// StateReader, passed to Lookup, reads the state machine's state under
// dragonboat's read lock (tests compare replicas with it).
type StateReader func(*lockfsm.State) any

// Query is what Lookup answers; exactly one kind is set. Its msgpack tags
// are its wire format: node forwards queries to other peers.
type Query struct {
	Kind    uint8  `msgpack:"k"`
	Session uint64 `msgpack:"s"`
	Req     uint64 `msgpack:"r"`
	Key     string `msgpack:"y"`
}

// Query kinds.
const (
	QueryRequest  uint8 = iota + 1 // the state of request Req of Session
	QueryKey                       // Key's holders and waiters
	QuerySessions                  // every session, the recorded term and the timed holds
)

// Answer is Lookup's reply to a Query.
type Answer struct {
	SessionFound bool                  `msgpack:"sf"`
	Request      lockfsm.RequestInfo   `msgpack:"rq"`
	KeyFound     bool                  `msgpack:"kf"`
	Key          lockfsm.KeyInfo       `msgpack:"ki"`
	Sessions     []lockfsm.SessionInfo `msgpack:"ss"`
	// Term is the leader term the state has recorded (QuerySessions).
	Term uint64 `msgpack:"t"`
	// Holds are the held locks with a maximum hold time (QuerySessions);
	// left out when there are none, as below feature level 3.
	Holds []lockfsm.HoldInfo `msgpack:"mh,omitempty"`
}

// Lookup answers a Query with an Answer, or runs a StateReader. A halted
// replica answers nothing: it fails with its *lockerr.HaltError.
func (s *Lock) Lookup(q any) (any, error) {
	if err := s.halt.err; err != nil {
		return nil, err
	}
	if read, ok := q.(StateReader); ok {
		return read(s.state), nil
	}
	lq, ok := q.(Query)
	if !ok {
		return nil, fmt.Errorf("shard %d: unknown query %T", s.shard, q)
	}
	var a Answer
	switch lq.Kind {
	case QueryRequest:
		a.Request, a.SessionFound = s.state.Request(lq.Session, lq.Req)
	case QueryKey:
		a.Key, a.KeyFound = s.state.Key(lq.Key)
	case QuerySessions:
		a.Sessions, a.Term, a.Holds = s.state.Sessions(), s.state.Term(), s.state.MaxHolds()
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
func (s *Lock) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, _ <-chan struct{}) error {
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
// nothing (ResultHalted), Lookup fails with the HaltError, SaveSnapshot is
// aborted (so no snapshot of the state it does not have is ever written),
// and OnStop stops the replica keeping its data. The snapshot stays in
// the data dir, and a peer that can read it loads it at its next start.
func (s *Lock) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, _ <-chan struct{}) error {
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

// Close releases nothing: the state is in memory.
func (s *Lock) Close() error { return nil }
