// Package lockfsm is the deterministic lock state machine of one lockmesh
// shard. Raft replicates a log of command batches; every replica feeds the
// same entries to Apply and so holds the same locks, hands them to the same
// waiters and issues the same fencing tokens. The package does no I/O, reads
// no clock, starts no goroutine, uses no randomness, and never lets Go's map
// order reach a result, a grant list or a snapshot.
//
// # Sessions
//
// Every lock belongs to a session, opened by OpOpenSession for an owner node
// with a TTL. The session ID is the index of the entry that opened it (see
// OpOpenSession for several opens in one entry), so IDs are never reused.
// The state machine keeps no time: the shard leader tracks keepalives in
// memory and proposes OpExpireSession when they stop; OpCloseSession is the
// graceful version. Both release everything the session holds, drop its
// waiters and forget it; later commands for it get StatusNoSession.
//
// # Session caps
//
// A shard holds at most MaxSessions sessions, and at most
// MaxSessionsPerOwner of one owner. The caps are rules of the state
// machine, checked when an entry is applied: an OpenSession marked Capped
// is refused with StatusSessionLimit, its Err naming the cap and the
// count, when the shard or its owner is full. So every replica refuses the
// same opens, and proposals accepted at the same time by different peers
// cannot together open more than the caps allow: they are applied one
// after the other, each against the counts the one before left. (A peer
// also checks the caps where it accepts a proposal, against the counts its
// replica last applied: that only refuses a flood before it reaches Raft.)
// The state counts the live sessions of each owner, on every open, close
// and expiry, so the check costs O(1); snapshots do not carry the counts:
// Load counts them from the sessions, and Verify checks them.
//
// Capped gates the rule, so that a log replays as it was first applied.
// Writers mark every OpenSession from feature level 3 on; below it, some
// replicas run releases that do not know the caps, and an unmarked
// OpenSession opens its session whatever the counts (it is still counted,
// so a marked one after it sees the table as it is).
//
// # Leader terms
//
// An expiry is a decision of one leader, taken on its own clock and its own
// view of keepalives, and only that leader's term may act on it. A new
// leader commits OpLeaderTerm with its Raft term before it acknowledges a
// keepalive or expires anything; the state keeps the highest term recorded
// (in snapshots too), and applies an OpExpireSession only if its Term is
// that term. Any other is answered StatusStaleTerm and changes nothing, so
// an expiry decided by a leader that was deposed while paused, and then
// forwarded to or retried on its successor, never ends a live session.
//
// # Lock attempts
//
// An attempt is named by (Session, Req), where Req is a request id the
// client makes unique and increasing per session. Two attempts of one
// session on one key exclude each other like attempts of two sessions: there
// is no reentrancy. Acquire grants when the key has fewer holders than its
// Limit (1 for a mutex, more for a semaphore) and nobody waits; otherwise it
// joins the key's FIFO queue (Wait) or is refused with StatusLocked
// (TryLock). A Release or Cancel of a holder, or the end of a session, hands
// the freed slots to the queue head(s) in the same entry, so a waiter is
// granted without another round trip, and the entry's grants are returned by
// Apply for the node to notify each session's owner. A key with no holders
// and no waiters is deleted.
//
// # Fencing tokens
//
// One counter per shard is bumped on every grant and stored in snapshots.
// Since a key lives in exactly one shard, its tokens strictly increase in
// grant order across entries, leader changes and restarts.
//
// # Deduplication and Ack
//
// A proposal that timed out is retried with the same ids, so every command is
// idempotent. A repeated Acquire answers from the attempt's current state,
// never granting or queueing twice:
//
//	held       -> StatusGranted with the token
//	waiting    -> StatusQueued
//	rejected   -> StatusLocked
//	released   -> StatusReleased with the token of the past grant
//	cancelled  -> StatusCancelled
//
// Reusing a Req for another key is StatusInvalid. Release of a released
// attempt is StatusOK again; Cancel of a cancelled or released one repeats
// StatusCancelled or StatusReleased. A Cancel for an attempt the state
// machine has never seen answers StatusCancelled and leaves a tombstone, so
// that an Acquire proposed earlier but applied later is answered
// StatusCancelled instead of queueing for a client that gave up.
//
// Terminal attempts (released, cancelled, rejected) are kept only until the
// client acknowledges them: every command carries Ack, meaning "I have the
// answers to all my requests below Ack", and an attempt is forgotten once
// its own Req and the Req of every Release or Cancel that touched it are
// below the session's highest Ack. Live attempts are never forgotten. An
// Acquire whose Req is below the Ack and not remembered is StatusInvalid,
// since the client promised not to send it again.
//
// # Encoding
//
// Command batches, results and snapshots are canonical msgpack behind a
// version byte; decoders read every version from MinVersion on, so logs and
// snapshots written by an earlier release replay after an upgrade. Commands
// have two formats: FormatPositional (a cluster at feature level 1 writes
// it) and FormatTagged, where a command is a map of field tags, so a new
// field or op is a new tag, not a new layout. A decoder that meets a
// version, op or field tag it does not know fails (ErrVersion,
// ErrUnsupported): the caller must stop applying the log there, never skip
// the entry, since replicas that understand it would apply it and diverge;
// the same holds for a snapshot Load refuses. SaveFormat writes a snapshot
// in the format the caller names (the one its cluster's feature level
// allows), so that a replica of an older release at that level can load it.
// Decoders take untrusted input: they never panic, bound every
// size (MaxEntrySize, MaxBatch, MaxKeyLen, MaxOwnerLen, MaxErrLen,
// MaxSnapshotSize) and check container lengths against the input left before
// allocating. Snapshots are sorted, so equal states give equal bytes and
// Save after Load reproduces the loaded bytes.
package lockfsm
