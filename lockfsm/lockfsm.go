package lockfsm

import (
	"fmt"
	"slices"
)

// Formats. The first byte of every encoded command batch (one Raft entry),
// result batch and snapshot is its format version. Decoders accept the
// versions they know and reject any other with ErrVersion, and a batch that
// uses an op or a field they do not know with ErrUnsupported, so a replica
// never guesses at, or skips, what a newer release wrote.
const (
	// FormatPositional is the command format in which every command is a
	// positional record of all its fields (version 2; version 1 lacked
	// Term). Adding a field to it means a new layout, so it is frozen: it is
	// what a cluster at feature level 1 writes.
	FormatPositional = 2
	// FormatTagged is the command format in which every command is a map
	// from field tag to value, with zero values left out. A new field or op
	// is a new tag or op number, not a new layout; a decoder that meets one
	// it does not know fails with ErrUnsupported. A cluster writes it from
	// feature level 2 on.
	FormatTagged = 3

	// Version is the newest command format EncodeCommands writes.
	Version = FormatTagged
	// MinVersion is the oldest format the decoders still read: logs and
	// snapshots written by earlier releases stay readable after an upgrade.
	MinVersion = 1

	// SnapshotVersion is the newest snapshot format, the one Save writes;
	// Load reads MinVersion to SnapshotVersion. Version 2 added the leader
	// term, and every feature level reads it; version 3 adds each session's
	// Label and the lock family, and a cluster writes it from feature
	// level 3 on; version 4 adds values, from level 4 on (see SaveFormat
	// and MinSnapshotFormat).
	SnapshotVersion = 4
	// ResultVersion is the newest format of result batches; DecodeResults
	// reads MinVersion to ResultVersion. Results travel back to the
	// proposer, which may run an older release than the replica, so
	// EncodeResults writes version 2 unless a result names holders
	// (version 3), which only an Acquire of feature level 3 asks for.
	ResultVersion = 3
)

// Limits enforced by Apply, ValidateKey and the decoders.
const (
	// MaxKeyLen is the longest key in bytes; longer keys are invalid.
	MaxKeyLen = 512
	// MaxOwnerLen is the longest session owner id in bytes.
	MaxOwnerLen = 256
	// MaxBatch is the most commands one Raft entry may carry.
	MaxBatch = 4096
	// MaxEntrySize is the largest encoded command or result batch in bytes.
	MaxEntrySize = 4 << 20
	// MaxErrLen is the longest Result.Err the result decoder accepts.
	MaxErrLen = 1024
	// MaxValueLen is the longest Command.Value in bytes.
	MaxValueLen = 1024
	// MaxSnapshotSize is the largest snapshot Load reads, in bytes (about
	// 30 million remembered lock attempts). It fits an int on 32-bit targets.
	MaxSnapshotSize = 1 << 30
)

// Session caps, enforced by Apply on every Capped OpenSession (feature
// level 3): it is refused with StatusSessionLimit when the shard already
// holds MaxSessions sessions, or its owner MaxSessionsPerOwner of them.
// They are part of the replicated rules, so every replica of a release
// refuses the same opens; a release that changes them changes what its
// replicas apply, and needs a new feature level like any other rule.
const (
	// MaxSessions is the most sessions a shard holds.
	MaxSessions = 1 << 16
	// MaxSessionsPerOwner is the most sessions of one owner a shard holds.
	MaxSessionsPerOwner = 1 << 12
)

// extraSessionBit marks the IDs of the second and later sessions opened by
// one entry. See OpOpenSession.
const extraSessionBit = 1 << 63

// maxExtraSessionIndex is the largest entry index for which extra session IDs
// (index<<12 | position) still fit below extraSessionBit.
const maxExtraSessionIndex = 1<<51 - 1

// Op is the kind of a Command.
type Op uint8

// The commands of the lock state machine.
const (
	// OpOpenSession opens a session for Owner with TTLMillis, and Label
	// when one is given (FormatTagged only); a Capped one is refused with
	// StatusSessionLimit when the session caps are reached. The result
	// carries the new session ID: the entry index for the first OpenSession
	// of an entry, and 1<<63 | index<<12 | position for any later one in the
	// same entry (position is the command's place in the batch), so IDs are
	// unique, never reused and the same on every replica.
	OpOpenSession Op = iota + 1
	// OpAcquire starts the lock attempt (Session, Req) on Key with Limit
	// concurrent holders; Wait queues it when it cannot be granted at once.
	OpAcquire
	// OpRelease releases the held attempt (Session, Target).
	OpRelease
	// OpCancel withdraws the attempt (Session, Target): it leaves the queue
	// if waiting, and is released if it was granted meanwhile.
	OpCancel
	// OpExpireSession ends Session because its keepalives stopped.
	OpExpireSession
	// OpCloseSession ends Session at the client's request.
	OpCloseSession
	// OpLeaderTerm records that the leader of Term took over the shard.
	// The state keeps the highest term recorded; from then on only an
	// ExpireSession decided in that term applies. A leader commits it
	// before it acknowledges any keepalive or expires any session.
	OpLeaderTerm
	// OpExpireHold ends the held attempt (Session, Target) because it was
	// held for its MaxHoldMillis, as its leader decided in Term: it
	// applies only if Term is the recorded leader term, as ExpireSession,
	// and hands the key on as a release does. Feature level 3.
	OpExpireHold
	// OpSetValue replaces the Value of the held attempt (Session,
	// Target): StatusOK with its token while it holds, StatusNotHeld once
	// it does not (it never held, or was released, cancelled or ended),
	// so a holder that lost its key cannot write over its successor's
	// value. An empty Value clears it. One whose Req is below a later
	// command's on the attempt (a retry overtaken by a newer SetValue)
	// answers StatusOK and changes nothing. Feature level 4.
	OpSetValue

	// maxOp is the highest op this release knows; decoders refuse higher
	// ones with ErrUnsupported.
	maxOp = OpSetValue
)

// String returns the op's name, or "Op(n)" for an unknown op.
func (o Op) String() string {
	switch o {
	case OpOpenSession:
		return "OpenSession"
	case OpAcquire:
		return "Acquire"
	case OpRelease:
		return "Release"
	case OpCancel:
		return "Cancel"
	case OpExpireSession:
		return "ExpireSession"
	case OpCloseSession:
		return "CloseSession"
	case OpLeaderTerm:
		return "LeaderTerm"
	case OpExpireHold:
		return "ExpireHold"
	case OpSetValue:
		return "SetValue"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Command is one operation in a Raft entry. Which fields matter depends on Op.
type Command struct {
	Op      Op
	Session uint64
	// Req is the request id, unique and increasing per session. For Acquire
	// it names the lock attempt; for Release and Cancel it only delays the
	// pruning of the target attempt (see Ack).
	Req uint64
	// Ack tells the state machine that the client has the answers to all its
	// requests below Ack, so terminal attempts below it may be forgotten.
	Ack uint64
	// Key is the lock name (Acquire).
	Key string
	// Wait queues an Acquire that cannot be granted now; false means TryLock.
	Wait bool
	// Limit is the most concurrent holders of Key (Acquire); 0 means 1.
	Limit uint32
	// Target is the Req of the Acquire being released or cancelled.
	Target uint64
	// Owner is the id of the node that owns the session (OpenSession); grant
	// notifications are routed to it.
	Owner string
	// TTLMillis is the session's time to live (OpenSession); it must be > 0.
	// The state machine only stores it: expiry is proposed by the leader.
	TTLMillis uint64
	// Label names the client-side session this replicated session belongs
	// to (OpenSession): a node.Session opens one replicated session per
	// shard, each with its own ID, and gives them all its one Label, which
	// queries return with every holder. 0 means none. Only FormatTagged
	// carries it (tag 12): a cluster writes it from feature level 3 on.
	Label uint64
	// Capped makes an OpenSession subject to the session caps
	// (MaxSessions, MaxSessionsPerOwner), enforced when the entry is
	// applied, so every replica refuses the same opens and concurrent
	// proposals cannot together open more than the caps allow. Every
	// writer at feature level 3 sets it; an OpenSession without it (any
	// entry written below level 3) is applied as before caps existed, so
	// the logs of older clusters replay as they were first applied. Only
	// FormatTagged carries it (tag 18).
	Capped bool

	// The lock family (Acquire; FormatTagged only, from feature level 3).
	//
	// Kind is what the attempt asks of Key: KindMutex (the zero value,
	// the only kind before level 3), KindRead or KindWrite on a
	// read/write key, KindSemaphore on a semaphore key. A key has one
	// role while anybody holds or waits for it: an Acquire of another
	// role's kind is refused with StatusMismatch.
	Kind Kind
	// Permits is how many of a semaphore key's Limit permits a
	// KindSemaphore attempt takes; 0 means 1.
	Permits uint32
	// Group makes this Acquire one of an all-or-nothing group of Group
	// Acquires (2 to MaxGroup): the command and the Group-1 after it in
	// the same entry, of the same Session with consecutive Reqs, on
	// distinct keys, with the same Wait and Group. They are granted
	// together in one entry or not at all. 0 means no group.
	Group uint16
	// Flags ask more of an Acquire: FlagDetail, FlagDeadlock.
	Flags Flags
	// MaxHoldMillis is the longest the attempt may hold its key once
	// granted (Acquire; 0 is no limit): the shard's leader then ends the
	// hold with ExpireHold, as if its session had expired. The state
	// machine only stores it.
	MaxHoldMillis uint64
	// Term is the Raft term of the leader that decided the command
	// (ExpireSession, LeaderTerm). An ExpireSession applies only if its
	// Term is the leader term the state has recorded: a leader whose term
	// ended can still have its expiry committed by its successor (a
	// proposal forwarded or retried after a pause), and it must not count.
	Term uint64

	// Value is what the attempt's holder says about its hold (Acquire:
	// kept from the Acquire while the attempt is live, its holder's or
	// waiter's; SetValue: the held attempt's new one), at most
	// MaxValueLen bytes. Queries return it with the holder: an
	// election's leader proclaims itself in it. Empty is none.
	// FormatTagged only (tag 19), from feature level 4.
	Value []byte
	// Priority orders an Acquire that waits ahead of the waiters of
	// lower priority that are neither deadlock-checked (FlagDeadlock) nor
	// of a group: those gain no wait-for edge the deadlock check would
	// have to see. Among equals, and behind every other waiter, the queue
	// stays FIFO. 0 is none. A Priority with FlagDeadlock, or in a group,
	// is StatusInvalid. FormatTagged only (tag 20), from feature level 4.
	Priority uint8
}

// Status is the outcome of one command.
type Status uint8

// Command outcomes.
const (
	// StatusOK: OpenSession, Release (also when already released), Expire and Close.
	StatusOK Status = iota + 1
	// StatusGranted: the Acquire holds the lock, now or from earlier; Token is set.
	StatusGranted
	// StatusQueued: the Acquire waits in the key's FIFO queue.
	StatusQueued
	// StatusLocked: a TryLock was refused because the key is held.
	StatusLocked
	// StatusCancelled: Cancel found the attempt waiting (or nothing to do).
	StatusCancelled
	// StatusReleased: the attempt had been granted and is now released;
	// Token is the token of that grant.
	StatusReleased
	// StatusNotHeld: Release of an attempt that does not hold the lock.
	StatusNotHeld
	// StatusNoSession: the session is unknown (never opened, expired or closed).
	StatusNoSession
	// StatusInvalid: the command is malformed; Result.Err says why.
	StatusInvalid
	// StatusStaleTerm: an ExpireSession decided in a term other than the
	// recorded leader term, or a LeaderTerm below it; nothing changed.
	StatusStaleTerm
	// StatusMismatch: an Acquire of a kind the key's role does not take
	// (a semaphore's key locked as a mutex); Err names both. Nothing
	// changed.
	StatusMismatch
	// StatusDeadlock: an Acquire with FlagDeadlock that would have waited
	// for ever, in a wait-for cycle of sessions; Err names the cycle. The
	// attempt is refused (terminal), as a TryLock is.
	StatusDeadlock
	// StatusLimitMismatch: a semaphore Acquire whose permit count (Limit)
	// differs from the key's; Err names both. Nothing changed.
	StatusLimitMismatch
	// StatusSessionLimit: a Capped OpenSession refused because the shard
	// holds MaxSessions sessions, or its owner MaxSessionsPerOwner; Err
	// names the cap and the count. No session was opened. Only Capped
	// opens get it, so only proposers of feature level 3 read it.
	StatusSessionLimit
)

// String returns the status name.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusGranted:
		return "Granted"
	case StatusQueued:
		return "Queued"
	case StatusLocked:
		return "Locked"
	case StatusCancelled:
		return "Cancelled"
	case StatusReleased:
		return "Released"
	case StatusNotHeld:
		return "NotHeld"
	case StatusNoSession:
		return "NoSession"
	case StatusInvalid:
		return "Invalid"
	case StatusStaleTerm:
		return "StaleTerm"
	case StatusMismatch:
		return "Mismatch"
	case StatusDeadlock:
		return "Deadlock"
	case StatusLimitMismatch:
		return "LimitMismatch"
	case StatusSessionLimit:
		return "SessionLimit"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Result is the answer to one command.
type Result struct {
	Status Status
	// Session is the new session ID (OpenSession).
	Session uint64
	// Token is the fencing token of the grant (Granted, Released, and OK of a
	// Release that released or had released a grant).
	Token uint64
	// Err explains a StatusInvalid, StatusStaleTerm, StatusMismatch,
	// StatusDeadlock, StatusLimitMismatch or StatusSessionLimit.
	Err string
	// Holders are the key's holders when an Acquire with FlagDetail is
	// refused (StatusLocked), in grant order, at most maxDetailHolders.
	Holders []Holder
}

// Grant is a side effect of Apply: a lock attempt that became a holder in
// this entry, either at once or by hand-off from a Release, Cancel, Expire or
// Close. The node that owns the session (Owner) must be told.
type Grant struct {
	Key     string
	Session uint64
	Req     uint64
	Token   uint64
	Owner   string
	// HandOff is true when the lock was passed on to a waiting attempt (by
	// a Release, Cancel, Expire or Close), and false when an Acquire was
	// granted at once: its proposer learns of that from the result, while
	// a waiter must be told.
	HandOff bool
}

// ReqState is the state of one lock attempt.
type ReqState uint8

// Lock attempt states. Waiting and Held are live; the others are terminal
// and kept only for deduplication until acknowledged (see Command.Ack).
const (
	ReqWaiting   ReqState = iota + 1 // queued in the key's FIFO
	ReqHeld                          // granted and not released
	ReqReleased                      // granted, then released (Release, Cancel)
	ReqCancelled                     // left the queue, or cancelled before its Acquire arrived
	ReqRejected                      // TryLock refused
)

// String returns the state name.
func (r ReqState) String() string {
	switch r {
	case ReqWaiting:
		return "Waiting"
	case ReqHeld:
		return "Held"
	case ReqReleased:
		return "Released"
	case ReqCancelled:
		return "Cancelled"
	case ReqRejected:
		return "Rejected"
	}
	return fmt.Sprintf("ReqState(%d)", uint8(r))
}

func (r ReqState) live() bool { return r == ReqWaiting || r == ReqHeld }

// attempt is one lock attempt (Session, Req) as remembered for dedup.
type attempt struct {
	key   string // "" for the tombstone of a Cancel that came before its Acquire
	token uint64 // token of the grant, once granted
	// last is the highest Req of the session's commands that touched this
	// attempt (its Acquire, Release or Cancel): the attempt is forgotten only
	// once the client acknowledged all of them.
	last    uint64
	permits uint32 // of a KindSemaphore attempt; 1 for every other
	// size is the number of attempts of its all-or-nothing group, and
	// offset its place in it: the group's request ids run from
	// req-offset to req-offset+size-1. Size 0 is no group.
	size   uint16
	offset uint8
	state  ReqState
	kind   Kind
	// deadlock records FlagDeadlock: the attempt's session counts as one
	// thread of control, so its waits are edges of the wait-for graph.
	deadlock bool
	priority uint8 // Command.Priority
}

// first is the request id of the first attempt of the group of req, the
// attempt at (req itself when it is in no group).
func (at *attempt) first(req uint64) uint64 { return req - uint64(at.offset) }

type session struct {
	id      uint64
	owner   string
	ttl     uint64
	label   uint64 // Command.Label of its OpenSession; 0 for none
	ack     uint64
	held    int
	waiting int
	reqs    map[uint64]*attempt
	// terminal lists the request ids of terminal attempts, the only ones
	// prune may forget, so an Ack costs O(unacknowledged), not O(held).
	terminal []uint64
}

// reqsIn returns the request ids of the session's attempts in state, in
// ascending order, so that what is done with them is the same on every
// replica.
func (sess *session) reqsIn(state ReqState) []uint64 {
	var reqs []uint64
	for req, at := range sess.reqs {
		if at.state == state {
			reqs = append(reqs, req)
		}
	}
	slices.Sort(reqs)
	return reqs
}

// finish records that the attempt req has reached a terminal state.
func (sess *session) finish(req uint64, at *attempt, state ReqState) {
	at.state = state
	sess.terminal = append(sess.terminal, req)
}

// lockKey is a key that is held or waited for. Most keys are mutexes with
// one holder and nobody waiting, so they are laid out to fit one 24-byte
// allocation: a lone holder lives in the lockKey itself (one; session ids
// are never 0), and everything else — a limit other than 1, a role other
// than mutex, two or more holders, waiters — in ext, which is nil until
// the key needs it and stays until the key is deleted. Holders and
// waiters name their attempts; a holder's token is its attempt's.
type lockKey struct {
	one [1]ref // the only holder, when one[0].session != 0
	ext *keyExt
}

// keyExt is what a lockKey holds beyond a lone mutex holder.
type keyExt struct {
	limit uint32
	role  role
	more  []ref // the holders, when there are two or more
	queue []ref // waiters in FIFO order
}

func newLockKey(limit uint32, r role) *lockKey {
	k := &lockKey{}
	if limit != 1 || r != roleMutex {
		k.ext = &keyExt{limit: limit, role: r}
	}
	return k
}

// extended returns the key's ext, made on first use.
func (k *lockKey) extended() *keyExt {
	if k.ext == nil {
		k.ext = &keyExt{limit: 1, role: roleMutex}
	}
	return k.ext
}

// limit returns the key's Limit: its holders (mutex) or permits (semaphore).
func (k *lockKey) limit() uint32 {
	if k.ext == nil {
		return 1
	}
	return k.ext.limit
}

// role returns what the key is: a mutex, read/write lock or semaphore.
func (k *lockKey) role() role {
	if k.ext == nil {
		return roleMutex
	}
	return k.ext.role
}

// setRole sets the role of a key decoded before its role was.
func (k *lockKey) setRole(r role) {
	if r != roleMutex || k.ext != nil {
		k.extended().role = r
	}
}

// holders returns the key's holders in grant order, so tokens ascend. The
// slice may alias the key: callers must not change it, only setHolders.
func (k *lockKey) holders() []ref {
	switch {
	case k.ext != nil && k.ext.more != nil:
		return k.ext.more
	case k.one[0].session != 0:
		return k.one[:]
	}
	return nil
}

// setHolders replaces the key's holders with h, which it keeps when h
// has two or more.
func (k *lockKey) setHolders(h []ref) {
	k.one[0] = ref{}
	if k.ext != nil {
		k.ext.more = nil
	}
	switch {
	case len(h) == 0:
	case len(h) == 1 && h[0].session != 0:
		k.one[0] = h[0]
	default: // a lone holder of session 0 is kept too, for Verify to refuse
		k.extended().more = h
	}
}

// addHolder appends h to the key's holders.
func (k *lockKey) addHolder(h ref) {
	switch {
	case k.ext != nil && k.ext.more != nil:
		k.ext.more = append(k.ext.more, h)
	case k.one[0].session != 0:
		k.setHolders([]ref{k.one[0], h})
	default:
		k.setHolders([]ref{h})
	}
}

// dropHolder removes the holder (session, req).
func (k *lockKey) dropHolder(session, req uint64) {
	if k.ext == nil || k.ext.more == nil {
		if h := k.one[0]; h.session == session && h.req == req {
			k.setHolders(nil)
		}
		return
	}
	more := slices.DeleteFunc(k.ext.more, func(h ref) bool { return h.session == session && h.req == req })
	if len(more) < 2 {
		k.setHolders(more)
	} else {
		k.ext.more = more
	}
}

// waiters returns the key's FIFO queue; its head is granted next.
func (k *lockKey) waiters() []ref {
	if k.ext == nil {
		return nil
	}
	return k.ext.queue
}

// setWaiters replaces the key's FIFO queue; an empty queue is dropped.
func (k *lockKey) setWaiters(w []ref) {
	if len(w) == 0 {
		w = nil
	}
	if w != nil || k.ext != nil {
		k.extended().queue = w
	}
}

// popWaiter removes the head of the queue.
func (k *lockKey) popWaiter() {
	q := k.waiters()
	q[0] = ref{}
	k.setWaiters(q[1:])
}

// unqueue removes the waiter (session, req) from the queue.
func (k *lockKey) unqueue(session, req uint64) {
	k.setWaiters(slices.DeleteFunc(k.waiters(), func(w ref) bool { return w.session == session && w.req == req }))
}

// idle reports whether nobody holds or waits for the key, which is then deleted.
func (k *lockKey) idle() bool { return len(k.holders()) == 0 && len(k.waiters()) == 0 }

// State is the lock state of one shard. Its zero value is not usable; call
// New. State is not safe for concurrent use: the node serialises Apply and
// queries as dragonboat does.
type State struct {
	index     uint64
	lastToken uint64
	// term is the highest leader term recorded by OpLeaderTerm (0 before
	// any): the only term whose ExpireSession applies.
	term     uint64
	sessions map[uint64]*session
	// owned counts the live sessions of each owner that has one, so the
	// session caps cost O(1) per OpenSession; len(sessions) is the total.
	// It is not in snapshots: Load counts it from the sessions.
	owned map[string]int
	keys  map[string]*lockKey
	// maxHold is the MaxHoldMillis of the live attempts that have one:
	// few do, so it is kept beside the attempts rather than in each.
	maxHold map[ref]uint64
	// values is the Value of the live attempts that have one, kept
	// beside them for the same reason.
	values map[ref][]byte
	// broken is all off outside this package's tests (brokenRules).
	broken brokenRules
}

// ref names an attempt: a key's holder or waiter, or the attempt of a
// maximum hold.
type ref struct{ session, req uint64 }

// New returns an empty state at index 0 whose first grant gets token 1.
func New() *State {
	return &State{sessions: map[uint64]*session{}, owned: map[string]int{}, keys: map[string]*lockKey{}, maxHold: map[ref]uint64{}, values: map[ref][]byte{}}
}

// Index returns the index of the last applied entry (0 before any).
func (s *State) Index() uint64 { return s.index }

// Term returns the leader term recorded last by OpLeaderTerm (0 before any).
func (s *State) Term() uint64 { return s.term }

// ValidateKey reports whether key can be locked: it must be non-empty and at
// most MaxKeyLen bytes. Any bytes are allowed.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("lockfsm: empty key")
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("lockfsm: key is %d bytes, longer than the limit of %d", len(key), MaxKeyLen)
	}
	return nil
}

// Apply applies one Raft entry, a batch of commands, at log index index,
// which must be greater than the previous one. Results are 1:1 with cmds.
// Grants lists every grant the entry made, in the order made; tokens in it
// ascend. Apply never panics on malformed commands: they get StatusInvalid.
// An index that does not increase answers every command StatusInvalid and
// changes nothing.
func (s *State) Apply(index uint64, cmds []Command) (results []Result, grants []Grant) {
	return s.apply(index, cmds, nil)
}

// apply is Apply, recording the entry's events in events when it is not
// nil (ApplyEvents).
func (s *State) apply(index uint64, cmds []Command, events *[]Event) (results []Result, grants []Grant) {
	results = make([]Result, len(cmds))
	if index <= s.index {
		for i := range results {
			results[i] = invalid(fmt.Sprintf("entry index %d does not follow the last applied index %d", index, s.index))
		}
		return results, nil
	}
	s.index = index
	a := applier{s: s, index: index, events: events}
	opened := false
	for i := 0; i < len(cmds); i++ {
		c := &cmds[i]
		switch {
		case c.Op == OpOpenSession:
			results[i] = a.openSession(c, i, opened)
			if results[i].Status == StatusOK {
				opened = true
			}
		case c.Op == OpAcquire && c.Group != 0:
			i += a.acquireGroup(cmds[i:], results[i:]) - 1
		default:
			results[i] = a.apply(c)
		}
	}
	for i := range results {
		results[i].Err = clip(results[i].Err)
	}
	return results, a.grants
}

func invalid(msg string) Result { return Result{Status: StatusInvalid, Err: msg} }

// clip cuts an explanation to MaxErrLen bytes, the most a result may
// carry: one that names long keys and owners (a deadlock's cycle) would
// otherwise make the entry's results unencodable, on every replica and
// again after every restart. Results are not replicated state, so where
// the cut falls changes nothing a replica keeps.
func clip(msg string) string {
	const more = "..."
	if len(msg) <= MaxErrLen {
		return msg
	}
	return msg[:MaxErrLen-len(more)] + more
}

// applier carries the grants and events of one entry.
type applier struct {
	s      *State
	index  uint64
	grants []Grant
	// events, when not nil, collects the entry's events (ApplyEvents);
	// ended is the kind a holder's end is reported as, by the command
	// being applied: EventExpired for the leader's expiries.
	events *[]Event
	ended  EventKind
}

func (a *applier) openSession(c *Command, pos int, extra bool) Result {
	if c.TTLMillis == 0 {
		return invalid("OpenSession: TTLMillis must be > 0")
	}
	if len(c.Owner) > MaxOwnerLen {
		return invalid(fmt.Sprintf("OpenSession: owner is %d bytes, longer than the limit of %d", len(c.Owner), MaxOwnerLen))
	}
	if c.Capped {
		if res, full := a.s.capped(c.Owner); full {
			return res
		}
	}
	id := a.index
	if extra {
		if a.index > maxExtraSessionIndex || pos >= MaxBatch {
			return invalid("OpenSession: only one session per entry can be opened at this index")
		}
		id = extraSessionBit | a.index<<12 | uint64(pos)
	}
	a.s.addSession(&session{id: id, owner: c.Owner, ttl: c.TTLMillis, label: c.Label, reqs: map[uint64]*attempt{}})
	return Result{Status: StatusOK, Session: id}
}

// capped applies the session caps to a new session of owner: full is
// true, with the refusal, when the shard or the owner has no room left.
func (s *State) capped(owner string) (res Result, full bool) {
	switch {
	case len(s.sessions) >= MaxSessions:
		return Result{Status: StatusSessionLimit, Err: fmt.Sprintf("OpenSession: the shard holds %d sessions, the limit MaxSessions is %d", len(s.sessions), MaxSessions)}, true
	case s.owned[owner] >= MaxSessionsPerOwner:
		return Result{Status: StatusSessionLimit, Err: fmt.Sprintf("OpenSession: owner %q holds %d sessions on the shard, the limit MaxSessionsPerOwner is %d", owner, s.owned[owner], MaxSessionsPerOwner)}, true
	}
	return Result{}, false
}

// addSession adds sess to the live sessions and counts it for its owner.
func (s *State) addSession(sess *session) {
	s.sessions[sess.id] = sess
	s.owned[sess.owner]++
}

// dropSession forgets the live session sess and uncounts it.
func (s *State) dropSession(sess *session) {
	delete(s.sessions, sess.id)
	if s.owned[sess.owner]--; s.owned[sess.owner] == 0 {
		delete(s.owned, sess.owner)
	}
}

func (a *applier) apply(c *Command) Result {
	switch c.Op {
	case OpAcquire:
		if err := ValidateKey(c.Key); err != nil {
			return invalid("Acquire: " + err.Error())
		}
		if c.Req == 0 {
			return invalid("Acquire: request id must be > 0")
		}
		if len(c.Value) > MaxValueLen {
			return invalid(fmt.Sprintf("Acquire: value is %d bytes, longer than the limit of %d", len(c.Value), MaxValueLen))
		}
	case OpSetValue:
		if len(c.Value) > MaxValueLen {
			return invalid(fmt.Sprintf("SetValue: value is %d bytes, longer than the limit of %d", len(c.Value), MaxValueLen))
		}
	case OpRelease, OpCancel, OpExpireSession, OpCloseSession, OpExpireHold:
	case OpLeaderTerm:
		return a.leaderTerm(c)
	default:
		return invalid(fmt.Sprintf("unknown op %d", uint8(c.Op)))
	}
	sess := a.s.sessions[c.Session]
	if sess == nil {
		return Result{Status: StatusNoSession}
	}
	if c.Ack > sess.ack {
		sess.ack = c.Ack
		sess.prune()
	}
	a.ended = EventReleased
	if c.Op == OpExpireSession || c.Op == OpExpireHold {
		a.ended = EventExpired
	}
	switch c.Op {
	case OpAcquire:
		return a.acquire(sess, c)
	case OpRelease:
		return a.release(sess, c)
	case OpCancel:
		return a.cancel(sess, c)
	case OpSetValue:
		return a.setValue(sess, c)
	case OpExpireSession:
		if c.Term != a.s.term {
			return Result{Status: StatusStaleTerm, Err: fmt.Sprintf("ExpireSession: decided in term %d, the shard's leader term is %d", c.Term, a.s.term)}
		}
		a.endSession(sess)
		return Result{Status: StatusOK}
	case OpExpireHold:
		if c.Term != a.s.term {
			return Result{Status: StatusStaleTerm, Err: fmt.Sprintf("ExpireHold: decided in term %d, the shard's leader term is %d", c.Term, a.s.term)}
		}
		at := sess.reqs[c.Target]
		if at == nil || at.state != ReqHeld || a.s.maxHold[ref{sess.id, c.Target}] == 0 {
			return Result{Status: StatusNotHeld}
		}
		a.unhold(sess, c.Target, at)
		return Result{Status: StatusReleased, Token: at.token}
	default: // OpCloseSession
		a.endSession(sess)
		return Result{Status: StatusOK}
	}
}

// leaderTerm records a new leader's term. Terms only grow: a LeaderTerm
// that arrives late, after a successor's, changes nothing.
func (a *applier) leaderTerm(c *Command) Result {
	switch {
	case c.Term == 0:
		return invalid("LeaderTerm: term must be > 0")
	case c.Term < a.s.term:
		return Result{Status: StatusStaleTerm, Err: fmt.Sprintf("LeaderTerm: term %d is below the recorded term %d", c.Term, a.s.term)}
	}
	a.s.term = c.Term
	return Result{Status: StatusOK}
}

// prune forgets terminal attempts whose every request is acknowledged.
func (sess *session) prune() {
	kept := sess.terminal[:0]
	for _, req := range sess.terminal {
		if sess.reqs[req].last < sess.ack {
			delete(sess.reqs, req)
		} else {
			kept = append(kept, req)
		}
	}
	clear(sess.terminal[len(kept):])
	sess.terminal = kept
}

// answer reports the current state of an existing attempt to a repeated Acquire.
func answer(at *attempt) Result {
	switch at.state {
	case ReqHeld:
		return Result{Status: StatusGranted, Token: at.token}
	case ReqWaiting:
		return Result{Status: StatusQueued}
	case ReqRejected:
		return Result{Status: StatusLocked}
	case ReqReleased:
		return Result{Status: StatusReleased, Token: at.token}
	default: // ReqCancelled
		return Result{Status: StatusCancelled}
	}
}

func (a *applier) acquire(sess *session, c *Command) Result {
	if at := sess.reqs[c.Req]; at != nil {
		return repeat(at, c)
	}
	if c.Req < sess.ack {
		return invalid(fmt.Sprintf("Acquire: request id %d is below the acknowledged id %d; use a new request id", c.Req, sess.ack))
	}
	k, res, ok := a.s.checkAcquire(c)
	if !ok {
		return res
	}
	at := newAttempt(c)
	sess.reqs[c.Req] = at
	if k == nil {
		k = newLockKey(limitOf(c), roleOf(c.Kind))
		a.s.keys[c.Key] = k
	}
	if a.s.queuePos(k, at) == 0 && a.s.canGrant(k, at) {
		a.s.noteLive(sess.id, c)
		a.grant(c.Key, k, sess, c.Req, at, false)
		return Result{Status: StatusGranted, Token: at.token}
	}
	if !c.Wait {
		sess.finish(c.Req, at, ReqRejected)
		res := Result{Status: StatusLocked}
		if c.Flags&FlagDetail != 0 {
			res.Holders = a.s.holders(k.holders(), maxDetailHolders)
		}
		a.dropIfIdle(c.Key, k)
		return res
	}
	if c.Flags&FlagDeadlock != 0 {
		if why := a.s.deadlock(sess, []uint64{c.Req}, []*attempt{at}); why != "" {
			sess.finish(c.Req, at, ReqRejected)
			a.dropIfIdle(c.Key, k)
			return Result{Status: StatusDeadlock, Err: fmt.Sprintf("Acquire %q: waiting would deadlock: %s", c.Key, why)}
		}
	}
	a.s.noteLive(sess.id, c)
	a.enqueue(k, sess, c.Req, at)
	return Result{Status: StatusQueued}
}

// noteLive records the MaxHoldMillis and Value of c, a new live attempt
// of session.
func (s *State) noteLive(session uint64, c *Command) {
	if c.MaxHoldMillis != 0 {
		s.maxHold[ref{session, c.Req}] = c.MaxHoldMillis
	}
	if len(c.Value) > 0 {
		s.values[ref{session, c.Req}] = slices.Clone(c.Value)
	}
}

// forgetLive forgets what noteLive recorded of an attempt that is live
// no longer.
func (s *State) forgetLive(r ref) {
	delete(s.maxHold, r)
	delete(s.values, r)
}

// repeat answers an Acquire whose attempt exists: a retry.
func repeat(at *attempt, c *Command) Result {
	if at.key != "" && at.key != c.Key {
		return invalid(fmt.Sprintf("Acquire: request id %d was already used for another key", c.Req))
	}
	if c.Req > at.last {
		at.last = c.Req
	}
	return answer(at)
}

// enqueue makes the new attempt a waiter of k: at the tail of its queue,
// or for a prioritized one (Command.Priority) ahead of the waiters it may
// pass.
func (a *applier) enqueue(k *lockKey, sess *session, req uint64, at *attempt) {
	at.state = ReqWaiting
	sess.waiting++
	k.setWaiters(slices.Insert(k.waiters(), a.s.queuePos(k, at), ref{session: sess.id, req: req}))
	a.event(EventQueued, at.key, sess, req, at)
}

// queuePos is where the new attempt at joins k's queue: its tail, or for
// a prioritized one ahead of the waiters of lower priority that are
// neither deadlock-checked nor of a group. At 0, at is its head, and is
// granted at once if it can be.
func (s *State) queuePos(k *lockKey, at *attempt) int {
	q := k.waiters()
	pos := len(q)
	for at.priority > 0 && pos > 0 {
		w := s.attemptOf(q[pos-1])
		if w.priority >= at.priority || w.deadlock || w.size != 0 {
			break
		}
		pos--
	}
	return pos
}

// dropIfIdle deletes k, made for an attempt that was then refused, once
// nobody holds or waits for it.
func (a *applier) dropIfIdle(key string, k *lockKey) {
	if k.idle() {
		delete(a.s.keys, key)
	}
}

// grant makes the attempt a holder of k with the next shard token.
func (a *applier) grant(key string, k *lockKey, sess *session, req uint64, at *attempt, handOff bool) {
	a.s.lastToken++
	at.state = ReqHeld
	at.token = a.s.lastToken
	sess.held++
	k.addHolder(ref{session: sess.id, req: req})
	a.grants = append(a.grants, Grant{Key: key, Session: sess.id, Req: req, Token: at.token, Owner: sess.owner, HandOff: handOff})
	if !handOff || !a.s.broken.eventsMissHandOff {
		a.event(EventGranted, key, sess, req, at)
	}
}

// handOff grants k's waiters in FIFO order while its head can be granted
// (a group's head only together with the rest of its group, at the heads
// of their keys' queues), and deletes k once nobody holds or waits for it.
// Granting a group takes the heads of its other keys' queues too, so those
// keys hand off next, in the order their grants were made.
func (a *applier) handOff(key string, k *lockKey) {
	work := []string{key}
	for len(work) > 0 {
		key, work = work[0], work[1:]
		k := a.s.keys[key]
		if k == nil {
			continue
		}
		for len(k.waiters()) > 0 {
			w := k.waiters()[0]
			sess := a.s.sessions[w.session]
			at := sess.reqs[w.req]
			if at.size == 0 || a.s.broken.groupPiecemeal {
				if !a.s.canGrant(k, at) {
					break
				}
				k.popWaiter()
				sess.waiting--
				a.grant(key, k, sess, w.req, at, true)
				continue
			}
			first := at.first(w.req)
			if !a.s.groupReady(sess, first, at.size) {
				break
			}
			for req := first; req < first+uint64(at.size); req++ {
				m := sess.reqs[req]
				mk := a.s.keys[m.key]
				mk.popWaiter()
				sess.waiting--
				a.grant(m.key, mk, sess, req, m, true)
				if m.key != key {
					work = append(work, m.key)
				}
			}
		}
		a.dropIfIdle(key, k)
	}
}

// unhold removes the held attempt (sess, req) from its key and hands off.
func (a *applier) unhold(sess *session, req uint64, at *attempt) {
	a.event(a.ended, at.key, sess, req, at)
	a.s.forgetLive(ref{sess.id, req})
	k := a.s.keys[at.key]
	k.dropHolder(sess.id, req)
	sess.held--
	sess.finish(req, at, ReqReleased)
	a.handOff(at.key, k)
}

// unqueue removes the waiting attempt (sess, req) from its key's queue,
// and with it every other waiting attempt of its group: a group is taken
// whole or not at all, so what is left of it could never be granted.
func (a *applier) unqueue(sess *session, req uint64, at *attempt) {
	first, last := req, req
	if at.size != 0 {
		first, last = at.first(req), at.first(req)+uint64(at.size)-1
	}
	for r := first; r <= last; r++ {
		m := sess.reqs[r]
		if m == nil || m.state != ReqWaiting {
			continue
		}
		k := a.s.keys[m.key]
		a.event(EventCancelled, m.key, sess, r, m)
		k.unqueue(sess.id, r)
		a.s.forgetLive(ref{sess.id, r})
		sess.waiting--
		sess.finish(r, m, ReqCancelled)
		// A waiter leaving frees no capacity, but it may have been the
		// head that blocked the queue (a group not ready, a large
		// semaphore request, a writer before readers).
		a.handOff(m.key, k)
	}
}

func touch(at *attempt, req uint64) {
	if req > at.last {
		at.last = req
	}
}

func (a *applier) release(sess *session, c *Command) Result {
	at := sess.reqs[c.Target]
	if at == nil {
		return Result{Status: StatusNotHeld}
	}
	touch(at, c.Req)
	switch at.state {
	case ReqHeld:
		a.unhold(sess, c.Target, at)
		return Result{Status: StatusOK, Token: at.token}
	case ReqReleased:
		return Result{Status: StatusOK, Token: at.token}
	default:
		return Result{Status: StatusNotHeld}
	}
}

// setValue replaces the value of the held attempt c.Target, and of no
// other: a hold that ended cannot write over its successor's.
func (a *applier) setValue(sess *session, c *Command) Result {
	at := sess.reqs[c.Target]
	if at == nil {
		return Result{Status: StatusNotHeld}
	}
	stale := c.Req < at.last // a retry that a later SetValue of the holder overtook
	touch(at, c.Req)
	r := ref{sess.id, c.Target}
	if at.state != ReqHeld {
		k := a.s.keys[at.key]
		if !a.s.broken.valueUnfenced || k == nil || len(k.holders()) == 0 {
			return Result{Status: StatusNotHeld}
		}
		r = k.holders()[0] // broken: over the key's holder now
	}
	if stale && at.state == ReqHeld {
		return Result{Status: StatusOK, Token: at.token}
	}
	if len(c.Value) == 0 {
		delete(a.s.values, r)
	} else {
		a.s.values[r] = slices.Clone(c.Value)
	}
	hs, hat := a.s.sessions[r.session], a.s.lookup(r)
	a.event(EventValue, hat.key, hs, r.req, hat)
	return Result{Status: StatusOK, Token: at.token}
}

func (a *applier) cancel(sess *session, c *Command) Result {
	at := sess.reqs[c.Target]
	if at == nil {
		// The Acquire may still be on its way (a retried proposal can land
		// after the Cancel): leave a tombstone so it is answered Cancelled
		// instead of queueing an attempt nobody waits for. Target 0 and
		// targets below the Ack can never be acquired, so need none.
		if c.Target != 0 && c.Target >= sess.ack {
			at := &attempt{last: max(c.Target, c.Req), permits: 1}
			sess.reqs[c.Target] = at
			sess.finish(c.Target, at, ReqCancelled)
		}
		return Result{Status: StatusCancelled}
	}
	touch(at, c.Req)
	switch at.state {
	case ReqWaiting:
		a.unqueue(sess, c.Target, at)
		return Result{Status: StatusCancelled}
	case ReqHeld:
		a.unhold(sess, c.Target, at)
		return Result{Status: StatusReleased, Token: at.token}
	case ReqReleased:
		return Result{Status: StatusReleased, Token: at.token}
	default: // ReqCancelled, ReqRejected: nothing is queued or held
		return Result{Status: StatusCancelled}
	}
}

// endSession drops the session's waiters, then releases what it holds with
// hand-offs, both in request id order so every replica grants alike.
// Waiters go first so a hold of the session is never handed to its own
// doomed waiter.
func (a *applier) endSession(sess *session) {
	reqs := make([]uint64, 0, sess.held+sess.waiting)
	for req, at := range sess.reqs {
		if at.state.live() {
			reqs = append(reqs, req)
		}
	}
	slices.Sort(reqs)
	var left []string // keys a waiter left: its head may be grantable now
	for _, req := range reqs {
		if at := sess.reqs[req]; at.state == ReqWaiting {
			k := a.s.keys[at.key]
			a.event(EventCancelled, at.key, sess, req, at)
			k.unqueue(sess.id, req)
			a.s.forgetLive(ref{sess.id, req})
			sess.waiting--
			at.state = ReqCancelled
			if k.idle() {
				delete(a.s.keys, at.key)
			} else {
				left = append(left, at.key)
			}
		}
	}
	for _, req := range reqs {
		if at := sess.reqs[req]; at.state == ReqHeld {
			a.unhold(sess, req, at)
		}
	}
	a.s.dropSession(sess)
	// A waiter leaving frees no capacity, but it may have been the head
	// that held the queue back (a group not ready, a large semaphore
	// request, a writer before readers, on a mutex of any limit). Where
	// it was not, the head still cannot be granted and handOff grants
	// nothing: without groups (below feature level 3) a mutex's head
	// waits only on its holders, so logs of earlier releases replay as
	// they were first applied.
	for _, key := range left {
		if k := a.s.keys[key]; k != nil {
			a.handOff(key, k)
		}
	}
}
