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
	// Label, and a cluster writes it from feature level 3 on (see
	// SaveFormat and MinSnapshotFormat).
	SnapshotVersion = 3
	// ResultVersion is the format of result batches EncodeResults writes;
	// DecodeResults reads MinVersion to ResultVersion. Results travel back
	// to the proposer, which may run an older release than the replica.
	ResultVersion = 2
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
	// MaxSnapshotSize is the largest snapshot Load reads, in bytes (about
	// 30 million remembered lock attempts). It fits an int on 32-bit targets.
	MaxSnapshotSize = 1 << 30
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
	// when one is given (FormatTagged only). The result
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

	// maxOp is the highest op this release knows; decoders refuse higher
	// ones with ErrUnsupported.
	maxOp = OpLeaderTerm
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
	// Term is the Raft term of the leader that decided the command
	// (ExpireSession, LeaderTerm). An ExpireSession applies only if its
	// Term is the leader term the state has recorded: a leader whose term
	// ended can still have its expiry committed by its successor (a
	// proposal forwarded or retried after a pause), and it must not count.
	Term uint64
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
	// Err explains a StatusInvalid or a StatusStaleTerm.
	Err string
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
	state ReqState
	token uint64 // token of the grant, once granted
	// last is the highest Req of the session's commands that touched this
	// attempt (its Acquire, Release or Cancel): the attempt is forgotten only
	// once the client acknowledged all of them.
	last uint64
}

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

// finish records that the attempt req has reached a terminal state.
func (sess *session) finish(req uint64, at *attempt, state ReqState) {
	at.state = state
	sess.terminal = append(sess.terminal, req)
}

// slot is a holder (token > 0) or a waiter (token 0) of a key.
type slot struct {
	session, req, token uint64
}

// lockKey is a key that is held or waited for. Most keys are mutexes with
// one holder and nobody waiting, so they are laid out to fit one 64-byte
// allocation: holders starts out backed by first, in the lockKey itself (a
// second holder, with Limit > 1, moves it to a slice of its own, as append
// does), and the waiters live behind a pointer that is nil until the key is
// contended.
type lockKey struct {
	limit   uint32
	holders []slot  // grant order, so tokens ascend
	first   [1]slot // backing array of holders until a second holder
	queue   *[]slot // waiters in FIFO order; nil while nobody waits
}

func newLockKey(limit uint32) *lockKey {
	k := &lockKey{limit: limit}
	k.holders = k.first[:0]
	return k
}

// waiters returns the key's FIFO queue; its head is granted next.
func (k *lockKey) waiters() []slot {
	if k.queue == nil {
		return nil
	}
	return *k.queue
}

// setWaiters replaces the key's FIFO queue; an empty queue is dropped.
func (k *lockKey) setWaiters(w []slot) {
	switch {
	case len(w) == 0:
		k.queue = nil
	case k.queue == nil:
		k.queue = new([]slot) // here, so that w itself does not escape
		*k.queue = w
	default:
		*k.queue = w
	}
}

// unqueue removes the waiter (session, req) from the queue.
func (k *lockKey) unqueue(session, req uint64) {
	k.setWaiters(slices.DeleteFunc(k.waiters(), func(w slot) bool { return w.session == session && w.req == req }))
}

// idle reports whether nobody holds or waits for the key, which is then deleted.
func (k *lockKey) idle() bool { return len(k.holders) == 0 && len(k.waiters()) == 0 }

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
	keys     map[string]*lockKey
}

// New returns an empty state at index 0 whose first grant gets token 1.
func New() *State {
	return &State{sessions: map[uint64]*session{}, keys: map[string]*lockKey{}}
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
	results = make([]Result, len(cmds))
	if index <= s.index {
		for i := range results {
			results[i] = invalid(fmt.Sprintf("entry index %d does not follow the last applied index %d", index, s.index))
		}
		return results, nil
	}
	s.index = index
	a := applier{s: s, index: index}
	opened := false
	for i := range cmds {
		c := &cmds[i]
		if c.Op == OpOpenSession {
			results[i] = a.openSession(c, i, opened)
			if results[i].Status == StatusOK {
				opened = true
			}
			continue
		}
		results[i] = a.apply(c)
	}
	return results, a.grants
}

func invalid(msg string) Result { return Result{Status: StatusInvalid, Err: msg} }

// applier carries the grants of one entry.
type applier struct {
	s      *State
	index  uint64
	grants []Grant
}

func (a *applier) openSession(c *Command, pos int, extra bool) Result {
	if c.TTLMillis == 0 {
		return invalid("OpenSession: TTLMillis must be > 0")
	}
	if len(c.Owner) > MaxOwnerLen {
		return invalid(fmt.Sprintf("OpenSession: owner is %d bytes, longer than the limit of %d", len(c.Owner), MaxOwnerLen))
	}
	id := a.index
	if extra {
		if a.index > maxExtraSessionIndex || pos >= MaxBatch {
			return invalid("OpenSession: only one session per entry can be opened at this index")
		}
		id = extraSessionBit | a.index<<12 | uint64(pos)
	}
	a.s.sessions[id] = &session{id: id, owner: c.Owner, ttl: c.TTLMillis, label: c.Label, reqs: map[uint64]*attempt{}}
	return Result{Status: StatusOK, Session: id}
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
	case OpRelease, OpCancel, OpExpireSession, OpCloseSession:
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
	switch c.Op {
	case OpAcquire:
		return a.acquire(sess, c)
	case OpRelease:
		return a.release(sess, c)
	case OpCancel:
		return a.cancel(sess, c)
	case OpExpireSession:
		if c.Term != a.s.term {
			return Result{Status: StatusStaleTerm, Err: fmt.Sprintf("ExpireSession: decided in term %d, the shard's leader term is %d", c.Term, a.s.term)}
		}
		a.endSession(sess)
		return Result{Status: StatusOK}
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
		if at.key != "" && at.key != c.Key {
			return invalid(fmt.Sprintf("Acquire: request id %d was already used for another key", c.Req))
		}
		if c.Req > at.last {
			at.last = c.Req
		}
		return answer(at)
	}
	if c.Req < sess.ack {
		return invalid(fmt.Sprintf("Acquire: request id %d is below the acknowledged id %d; use a new request id", c.Req, sess.ack))
	}
	limit := c.Limit
	if limit == 0 {
		limit = 1
	}
	k := a.s.keys[c.Key]
	if k != nil && k.limit != limit {
		return invalid(fmt.Sprintf("Acquire: limit %d differs from the key's current limit %d", limit, k.limit))
	}
	at := &attempt{key: c.Key, last: c.Req}
	sess.reqs[c.Req] = at
	if k == nil {
		k = newLockKey(limit)
		a.s.keys[c.Key] = k
	}
	if len(k.waiters()) == 0 && uint64(len(k.holders)) < uint64(k.limit) {
		a.grant(c.Key, k, sess, c.Req, at, false)
		return Result{Status: StatusGranted, Token: at.token}
	}
	if !c.Wait {
		sess.finish(c.Req, at, ReqRejected)
		return Result{Status: StatusLocked}
	}
	at.state = ReqWaiting
	sess.waiting++
	k.setWaiters(append(k.waiters(), slot{session: sess.id, req: c.Req}))
	return Result{Status: StatusQueued}
}

// grant makes the attempt a holder of k with the next shard token.
func (a *applier) grant(key string, k *lockKey, sess *session, req uint64, at *attempt, handOff bool) {
	a.s.lastToken++
	at.state = ReqHeld
	at.token = a.s.lastToken
	sess.held++
	k.holders = append(k.holders, slot{session: sess.id, req: req, token: at.token})
	a.grants = append(a.grants, Grant{Key: key, Session: sess.id, Req: req, Token: at.token, Owner: sess.owner, HandOff: handOff})
}

// handOff grants waiters in FIFO order while k has spare capacity, and
// deletes k once nobody holds or waits for it.
func (a *applier) handOff(key string, k *lockKey) {
	queue := k.waiters()
	for len(queue) > 0 && uint64(len(k.holders)) < uint64(k.limit) {
		w := queue[0]
		queue[0] = slot{}
		queue = queue[1:]
		sess := a.s.sessions[w.session]
		at := sess.reqs[w.req]
		sess.waiting--
		a.grant(key, k, sess, w.req, at, true)
	}
	k.setWaiters(queue)
	if k.idle() {
		delete(a.s.keys, key)
	}
}

// unhold removes the held attempt (sess, req) from its key and hands off.
func (a *applier) unhold(sess *session, req uint64, at *attempt) {
	k := a.s.keys[at.key]
	k.holders = slices.DeleteFunc(k.holders, func(h slot) bool { return h.session == sess.id && h.req == req })
	sess.held--
	sess.finish(req, at, ReqReleased)
	a.handOff(at.key, k)
}

// unqueue removes the waiting attempt (sess, req) from its key's queue.
func (a *applier) unqueue(sess *session, req uint64, at *attempt) {
	k := a.s.keys[at.key]
	k.unqueue(sess.id, req)
	sess.waiting--
	sess.finish(req, at, ReqCancelled)
	// A waiter leaving never frees capacity, but the queue may now be empty.
	a.handOff(at.key, k)
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

func (a *applier) cancel(sess *session, c *Command) Result {
	at := sess.reqs[c.Target]
	if at == nil {
		// The Acquire may still be on its way (a retried proposal can land
		// after the Cancel): leave a tombstone so it is answered Cancelled
		// instead of queueing an attempt nobody waits for. Target 0 and
		// targets below the Ack can never be acquired, so need none.
		if c.Target != 0 && c.Target >= sess.ack {
			at := &attempt{last: max(c.Target, c.Req)}
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
	for _, req := range reqs {
		if at := sess.reqs[req]; at.state == ReqWaiting {
			k := a.s.keys[at.key]
			k.unqueue(sess.id, req)
			sess.waiting--
			at.state = ReqCancelled
			if k.idle() {
				delete(a.s.keys, at.key)
			}
		}
	}
	for _, req := range reqs {
		if at := sess.reqs[req]; at.state == ReqHeld {
			a.unhold(sess, req, at)
		}
	}
	delete(a.s.sessions, sess.id)
}
