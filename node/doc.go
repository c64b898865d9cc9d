// Package node is lockmesh's public API: an embeddable peer of a
// peer-to-peer lock mesh.
//
// Start a Node in every application process. Peers find each other over
// gossip (one Join address is enough), agree on a layout of lock shards
// (BootstrapExpect peers form the cluster; later peers join it) and keep
// lock state in Raft shards replicated on ReplicationFactor peers each. A
// key lives in one shard for ever, chosen by a hash of its bytes; a peer
// that hosts no replica of a key's shard forwards the request to one that
// does.
//
// # Locks
//
// Lock blocks until the key is granted, in FIFO order, and TryLock fails at
// once with ErrLocked. Every grant carries a fencing token, strictly
// increasing per key across leader changes, restarts and retries: pass it to
// the resource you protect and have the resource reject lower tokens (Fence
// does that).
//
// # Sessions and leases
//
// Locks belong to a session, one per peer and shard, kept alive by
// keepalives sent to the shard's leader every TTL/4. The leader tracks
// keepalives in memory and expires a session after a TTL of silence, which
// releases its locks and grants them to the next waiters. The holder's side
// counts its lease from the send time of its last acknowledged keepalive,
// minus LeaseMargin, on a clock that counts time the machine spends
// suspended (internal/clock's Boot); when that passes Lock.Done
// closes. Since the leader counts from when it received the keepalive, and
// acknowledges it only after confirming its leadership with a ReadIndex
// round, the holder always gives up before the cluster can grant the lock
// to someone else, as long as clock rates differ by less than the margin.
// The argument in full is in docs/SAFETY.md.
//
// # Retries
//
// Every acquire carries (session, request id). A proposal whose outcome is
// unknown (timeout, lost connection, leader change) is sent again unchanged
// and the state machine answers the repeat from its dedup state, so a retry
// never grants twice. A waiter whose context ends cancels its request; if
// the grant raced the cancellation the lock is released, never leaked.
//
// # Errors
//
// Errors wrap the sentinels in errors.go; check them with errors.Is.
// A lock call: ErrLocked (a TryLock refused; a *LockedError names the
// holders), ErrAlreadyHeld, ErrDeadlock, ErrKindMismatch,
// ErrLimitMismatch. A hold: ErrLeaseExpired, ErrNotHeld, ErrReleased (a
// Lock.Context's cause), ErrSessionClosed, ErrStaleToken (Fence). The
// cluster: ErrUnavailable, ErrReplicaHalted, ErrIncompatible (a feature
// level not raised yet), ErrClosed. Bad input: ErrInvalidKey,
// ErrInvalidArgument, ErrInvalidConfig. Elections and watches:
// ErrNoLeader, ErrSlowWatcher. A wait whose ctx ended returns a
// *WaitError.
package node
