package replica

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/contention"
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
	// OnApply is peer.Hooks.OnApply; nil in production.
	OnApply func(shard, index uint64, grants []lockfsm.Grant)
	// SkipTermCheck is peer.Hooks.UnsafeSkipExpiryTerm: every
	// ExpireSession is stamped with the recorded term, so none is ever
	// refused.
	SkipTermCheck bool
	// MaxFormat is the newest command format this replica reads:
	// lockfsm.Version (0 reads as that), or older for a peer held at an
	// older feature level.
	MaxFormat byte
	// MaxSnapshot, when not 0, is the newest snapshot format this replica
	// loads, older than lockfsm.SnapshotVersion: a peer held back by a test
	// (peer.Hooks.HoldSnapshot) to play an older release.
	MaxSnapshot byte
	// SnapshotFormat is the snapshot format to save in: the one of the
	// cluster's feature level (level.Level.LockSnapshotFormat of the cluster's level),
	// so that any replica the snapshot is sent to can load it. nil saves
	// lockfsm.SnapshotVersion.
	SnapshotFormat func() byte
	// Halt is this replica's Halter; the state machine keeps its own copy.
	Halt Halter
	// Counts, when not nil, counts the entries and commands applied; the
	// peer's replicas share one.
	Counts *Counts
	// Now is the local clock the replica dates its observations of grants
	// and waits with (internal/contention); nil is time.Now.
	Now func() time.Time
	// Journal, when not nil, keeps the events of the entries applied last,
	// for watches.
	Journal *Journal
	// ReplayedTo, when not nil, returns the commit index the replica's
	// stored Raft state recorded when it started: entries up to it were
	// committed before, and are dated as applied late. It is called once,
	// at the first entry applied.
	ReplayedTo func() uint64
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
	now            func() time.Time
	replayedTo     func() uint64
	lateTo         uint64 // entries up to this index are applied late
	seen           *contention.Tracker
	journal        *Journal
}

// NewLock returns the state machine of a new replica of cfg.Shard, with an
// empty state: dragonboat fills it from the snapshot and log it holds.
func NewLock(cfg LockConfig) *Lock {
	maxFormat := cfg.MaxFormat
	if maxFormat == 0 {
		maxFormat = lockfsm.Version
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	return &Lock{shard: cfg.Shard, state: lockfsm.New(), onGrant: cfg.OnGrant,
		onApply: cfg.OnApply, skipTermCheck: cfg.SkipTermCheck,
		maxFormat: maxFormat, maxSnapshot: cfg.MaxSnapshot,
		snapshotFormat: cfg.SnapshotFormat, halt: cfg.Halt, counts: cfg.Counts,
		now: now, replayedTo: cfg.ReplayedTo, seen: contention.New(now()), journal: cfg.Journal}
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
	if err != nil && s.halt.skips(s.shard, e, err) {
		// Nothing was applied: to a proposer, as a halted replica's entry.
		return sm.Result{Value: ResultHalted, Data: []byte(fmt.Sprintf("entry %d skipped unread (UnsafeSkipEntries): %v", e.Index, err))}, nil
	}
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
	var results []lockfsm.Result
	var grants []lockfsm.Grant
	if s.journal != nil {
		var events []lockfsm.Event
		results, grants, events = s.state.ApplyEvents(e.Index, cmds)
		s.journal.add(e.Index, events)
	} else {
		results, grants = s.state.Apply(e.Index, cmds)
	}
	if s.counts != nil {
		s.counts.Entries.Add(1)
		s.counts.Commands.Add(uint64(len(cmds)))
	}
	if s.onApply != nil {
		s.onApply(s.shard, e.Index, grants)
	}
	s.observe(e.Index, cmds, results, grants)
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

// observe dates what entry index did: the waits it began and ended and
// the grants it made (see internal/contention).
func (s *Lock) observe(index uint64, cmds []lockfsm.Command, results []lockfsm.Result, grants []lockfsm.Grant) {
	if s.replayedTo != nil {
		s.lateTo, s.replayedTo = s.replayedTo(), nil
	}
	late := index <= s.lateTo
	var now time.Time
	for i, r := range results {
		switch {
		case r.Status == lockfsm.StatusQueued && cmds[i].Op == lockfsm.OpAcquire:
			if now.IsZero() {
				now = s.now()
			}
			s.seen.Queued(now, contention.Attempt{Session: cmds[i].Session, Req: cmds[i].Req}, late, s.waiting)
		case r.Status == lockfsm.StatusCancelled && cmds[i].Op == lockfsm.OpCancel:
			s.seen.Left(contention.Attempt{Session: cmds[i].Session, Req: cmds[i].Target})
		}
	}
	if len(grants) == 0 {
		return
	}
	if now.IsZero() {
		now = s.now()
	}
	s.seen.Granted(now, s.state.LastToken(), late)
	for _, g := range grants {
		if g.HandOff {
			s.seen.HandedOff(now, contention.Attempt{Session: g.Session, Req: g.Req}, g.Key)
		}
	}
}

// waiting reports whether attempt a still waits in the state.
func (s *Lock) waiting(a contention.Attempt) bool {
	info, _ := s.state.Request(a.Session, a.Req)
	return info.State == lockfsm.ReqWaiting
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
	// Ages asks a QueryKey answer for the ages of the key's holds and
	// waits (Answer.HolderAges, WaiterAges). Peers set it from feature
	// level 3, which every replica then reads.
	Ages bool `msgpack:"a,omitempty"`
	// K is how many keys and holds a QueryTop answers, at most MaxTop.
	K int `msgpack:"n,omitempty"`
	// Prefix makes a QueryWatch answer every key that starts with Key.
	Prefix bool `msgpack:"p,omitempty"`
	// After is a QueryKeys' cursor: the keys after it in byte order.
	After string `msgpack:"c,omitempty"`
}

// MaxTop bounds Query.K.
const MaxTop = 100

// Query kinds.
const (
	QueryRequest  uint8 = iota + 1 // the state of request Req of Session
	QueryKey                       // Key's holders and waiters
	QuerySessions                  // every session, the recorded term and the timed holds
	QueryTop                       // the most contended keys and longest holds (feature level 3)
	QueryWaits                     // the keys with waiters, for cross-shard deadlocks (feature level 3)
	QueryWatch                     // Key's (or, with Prefix, its keys') state and the index it is at (feature level 4)
	QueryKeys                      // the keys that start with Key after After, at most K, with ages (feature level 4)
)

// MaxInspectKeys bounds a QueryKeys' K.
const MaxInspectKeys = 1000

// MaxWatchKeys bounds the keys a QueryWatch answers: a prefix watch of
// more keys is refused.
const MaxWatchKeys = 1024

// MaxWaitAttempts bounds the holders and waiters a QueryWaits answers;
// past it the answer is cut short (Answer.WaitsComplete false).
const MaxWaitAttempts = 8192

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
	// HolderAges and WaiterAges date Key's holders and waiters, in their
	// order (QueryKey with Ages).
	HolderAges []Age `msgpack:"ha,omitempty"`
	WaiterAges []Age `msgpack:"wa,omitempty"`
	// Top answers a QueryTop.
	Top *Top `msgpack:"tp,omitempty"`
	// Waits answers a QueryWaits: lockfsm.State.WaitGraph, complete
	// unless WaitsComplete is false.
	Waits         []lockfsm.WaitKey `msgpack:"wt,omitempty"`
	WaitsComplete bool              `msgpack:"wc,omitempty"`
	// Keys and Index answer a QueryWatch: the keys held or waited for, at
	// the state of entry Index; KeysMore is true when there were more
	// than MaxWatchKeys.
	Keys     []lockfsm.KeyInfo `msgpack:"ks,omitempty"`
	Index    uint64            `msgpack:"ix,omitempty"`
	KeysMore bool              `msgpack:"km,omitempty"`
	// KeyAges date the holders and waiters of each of Keys (QueryKeys),
	// as HolderAges and WaiterAges do one key's.
	KeyAges []KeyAges `msgpack:"ka,omitempty"`
}

// KeyAges are the ages of one key's holders and waiters, in their order.
type KeyAges struct {
	Holders []Age `msgpack:"h,omitempty"`
	Waiters []Age `msgpack:"w,omitempty"`
}

// Age is how long ago a grant or wait began, as the answering replica
// saw it (contention.Age).
type Age struct {
	Micros  uint64 `msgpack:"u"`
	AtLeast bool   `msgpack:"l,omitempty"`
	Known   bool   `msgpack:"k,omitempty"`
}

func ageOf(a contention.Age) Age {
	return Age{Micros: uint64(a.Dur / time.Microsecond), AtLeast: a.AtLeast, Known: a.Known}
}

// Top is a shard's most contended keys and longest holds (QueryTop).
type Top struct {
	// SinceMillis is when the answering replica started observing, in
	// Unix milliseconds.
	SinceMillis int64     `msgpack:"s"`
	Keys        []TopKey  `msgpack:"k"`
	Holds       []TopHold `msgpack:"h"`
}

// TopKey is a contended key: its waiters now, and what the replica's
// summary counted of its past waits (contention.KeyStat).
type TopKey struct {
	Key             string `msgpack:"y"`
	Waiters         int    `msgpack:"w"`
	OldestWait      Age    `msgpack:"o"`
	Handoffs        uint64 `msgpack:"h"`
	WaitMicros      uint64 `msgpack:"t"`
	OvercountMicros uint64 `msgpack:"c"`
}

// CompareTopKeys orders contended keys most contended first: by their
// summed past waits plus the wait going on now, then by waiters now, then
// by key. A shard's answer and node's merge of every shard's use it.
func CompareTopKeys(a, b TopKey) int {
	score := func(tk TopKey) uint64 { return tk.WaitMicros + tk.OldestWait.Micros }
	return cmp.Or(cmp.Compare(score(b), score(a)), cmp.Compare(b.Waiters, a.Waiters), cmp.Compare(a.Key, b.Key))
}

// TopHold is a hold granted long ago.
type TopHold struct {
	Key    string         `msgpack:"y"`
	Holder lockfsm.Holder `msgpack:"h"`
	Age    Age            `msgpack:"a"`
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
		if lq.Ages && a.KeyFound {
			ages := s.ages(a.Key, s.now())
			a.HolderAges, a.WaiterAges = ages.Holders, ages.Waiters
		}
	case QueryKeys:
		a.Index = s.state.Index()
		a.Keys, a.KeysMore = s.state.KeysWithPrefix(lq.Key, lq.After, min(max(lq.K, 1), MaxInspectKeys))
		now := s.now()
		for _, k := range a.Keys {
			a.KeyAges = append(a.KeyAges, s.ages(k, now))
		}
	case QueryTop:
		a.Top = s.top(min(max(lq.K, 1), MaxTop))
	case QueryWaits:
		a.Waits, a.WaitsComplete = s.state.WaitGraph(MaxWaitAttempts)
	case QuerySessions:
		a.Sessions, a.Term, a.Holds = s.state.Sessions(), s.state.Term(), s.state.MaxHolds()
	case QueryWatch:
		a.Index = s.state.Index()
		if lq.Prefix {
			a.Keys, a.KeysMore = s.state.KeysWithPrefix(lq.Key, "", MaxWatchKeys)
		} else if info, ok := s.state.Key(lq.Key); ok {
			a.Keys = []lockfsm.KeyInfo{info}
		}
	default:
		return nil, fmt.Errorf("shard %d: unknown query kind %d", s.shard, lq.Kind)
	}
	return a, nil
}

// ages dates k's holders and waiters at now.
func (s *Lock) ages(k lockfsm.KeyInfo, now time.Time) KeyAges {
	var ka KeyAges
	for _, h := range k.Holders {
		ka.Holders = append(ka.Holders, ageOf(s.seen.GrantAge(now, h.Token)))
	}
	for _, w := range k.Waiters {
		ka.Waiters = append(ka.Waiters, ageOf(s.seen.WaitAge(now, contention.Attempt{Session: w.Session, Req: w.Req})))
	}
	return ka
}

// top answers a QueryTop for k: the keys of the longest queues now and of
// the summary of past waits, ranked by their summed past waits plus the
// oldest wait going on, and the k holds granted longest ago. It scans
// every key of the shard (lockfsm.State.Contention).
func (s *Lock) top(k int) *Top {
	now := s.now()
	queues, oldest := s.state.Contention(k)
	t := &Top{SinceMillis: s.seen.Since().UnixMilli()}
	byKey := map[string]*TopKey{}
	add := func(key string) *TopKey {
		if tk, ok := byKey[key]; ok {
			return tk
		}
		tk := &TopKey{Key: key}
		if info, ok := s.state.Key(key); ok && len(info.Waiters) > 0 {
			w := info.Waiters[0]
			tk.Waiters = len(info.Waiters)
			tk.OldestWait = ageOf(s.seen.WaitAge(now, contention.Attempt{Session: w.Session, Req: w.Req}))
		}
		byKey[key] = tk
		return tk
	}
	for _, q := range queues {
		add(q.Key)
	}
	for _, ks := range s.seen.Keys() {
		tk := add(ks.Key)
		tk.Handoffs, tk.WaitMicros, tk.OvercountMicros = ks.Handoffs, uint64(ks.Wait/time.Microsecond), uint64(ks.Overcount/time.Microsecond)
	}
	for _, tk := range byKey {
		t.Keys = append(t.Keys, *tk)
	}
	slices.SortFunc(t.Keys, CompareTopKeys)
	if len(t.Keys) > k {
		t.Keys = t.Keys[:k]
	}
	for _, h := range oldest {
		t.Holds = append(t.Holds, TopHold{Key: h.Key, Holder: h.Holder, Age: ageOf(s.seen.GrantAge(now, h.Token))})
	}
	return t
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
		return nil
	}
	s.seen.Loaded(s.now(), s.state.LastToken())
	if s.journal != nil {
		s.journal.reset(s.state.Index())
	}
	return nil
}

// Close releases nothing: the state is in memory.
func (s *Lock) Close() error { return nil }
