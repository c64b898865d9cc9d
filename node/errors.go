package node

import (
	"context"
	"errors"
	"fmt"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/lockerr"
)

// Sentinel errors returned by the node API. Check them with errors.Is; the
// returned errors wrap them with the key, shard or peer involved. Those
// node's internal packages return too are defined in internal/lockerr.
var (
	// ErrLocked is returned by TryLock when the key is held by someone else
	// (or others are already queued for it).
	ErrLocked = lockerr.Locked
	// ErrLeaseExpired means the lease of the session that held the lock may
	// have expired: keepalives were not acknowledged within the TTL, or the
	// cluster expired the session. Stop touching the protected resource.
	ErrLeaseExpired = lockerr.LeaseExpired
	// ErrNotHeld is returned by Unlock when the lock is no longer held, for
	// example because it was already unlocked.
	ErrNotHeld = lockerr.NotHeld
	// ErrSessionClosed is returned by Lock.Err for a lock whose Session was
	// closed, and by calls on a closed Session.
	ErrSessionClosed = lockerr.SessionClosed
	// ErrAlreadyHeld is returned at once by a Session's Lock, TryLock,
	// RWMutex locks and LockAll for a key the Session holds: the call
	// would otherwise queue behind its own session until ctx ended. A
	// reentrant Session re-enters a key it locks as the kind it holds it
	// (WithReentrant), never in LockAll; a semaphore's permits may be
	// taken several times over. (Node.Lock's default session is shared by
	// every caller of the node, so there a second Lock of a held key waits
	// for the first holder.)
	ErrAlreadyHeld = lockerr.AlreadyHeld
	// ErrClosed is returned by calls made after Close, and by Lock.Err for
	// a lock held when its node closed.
	ErrClosed = lockerr.Closed
	// ErrInvalidKey is returned for an empty or oversized key.
	ErrInvalidKey = lockerr.InvalidKey
	// ErrInvalidConfig is returned by Config.Validate and Start.
	ErrInvalidConfig = lockerr.InvalidConfig
	// ErrInvalidArgument means a call's argument is out of range: a
	// semaphore of no permits, an acquire of more permits than it has, a
	// LockAll of no keys, of a key twice or of more than MaxLockAll. The
	// error names the problem; nothing was taken.
	ErrInvalidArgument = errors.New("lockmesh: invalid argument")
	// ErrUnavailable means the shard owning a key could not be reached before
	// the context ended: not enough peers are up or the network is cut.
	ErrUnavailable = lockerr.Unavailable
	// ErrReplicaHalted means a replica of the shard met a log entry or a
	// snapshot it cannot decode or does not understand (written by a newer
	// release) and stopped applying, rather than skip it and diverge. Calls
	// retry on other replicas; upgrade the peer, and its replica replays
	// the entry or loads the snapshot.
	ErrReplicaHalted = lockerr.ReplicaHalted
	// ErrIncompatible means this peer and the cluster (or another peer) have
	// no protocol version or feature level in common; the message names
	// both and which one to upgrade.
	ErrIncompatible = lockerr.Incompatible
	// ErrReleased is the cause (context.Cause) of a Lock's Context once the
	// lock was unlocked or released by its holder.
	ErrReleased = errors.New("lockmesh: lock released")
	// ErrStaleToken is returned by Fence.Check for a token lower than one
	// already seen for the same key.
	ErrStaleToken = errors.New("lockmesh: stale fencing token")
)

// HaltError says where and why a replica stopped applying its shard's log:
// at an entry, or at a snapshot, it could not read. It wraps
// ErrReplicaHalted and the decoding error. Its fields: Shard (1 is the
// meta shard); Index, the log index of the entry it could not apply or of
// the snapshot it could not load (0 if dragonboat did not say); Version,
// the entry's or snapshot's format version byte; Snapshot, whether it
// halted at a snapshot rather than an entry; Err, why it could not be
// decoded. Match it with errors.As.
type HaltError = lockerr.HaltError

var (
	// ErrDeadlock means a Session's wait was refused because it could
	// never have been granted: it closed a cycle of Sessions, each waiting
	// for what the next one holds or is queued ahead for. Within one shard
	// the wait is refused at once; across shards, within about a second of
	// the cycle closing (docs/LOCKS.md). The error names the cycle by
	// Session ID. The Session holds what it held before.
	ErrDeadlock = lockerr.Deadlock
	// ErrLimitMismatch means a semaphore was asked for with another permit
	// count than the one its key is in use with; the error names both.
	ErrLimitMismatch = lockerr.LimitMismatch
	// ErrKindMismatch means a key in use as one kind of lock (a mutex, a
	// read/write lock, a semaphore) was asked for as another.
	ErrKindMismatch = lockerr.KindMismatch
)

// LockedError is what a refused try (TryLock, TryRLock, TryAcquire,
// TryLockAll) returns: errors.Is(err, ErrLocked) holds, and errors.As
// gives the key and, from feature level 3, who held it when it was
// refused, so "who holds it?" needs no second call. The cluster keeps no
// wall-clock time, so a holder's age is not known; its token orders it
// among the key's grants.
type LockedError struct {
	Key string
	// Holders held the key when the try was refused, in grant order; at
	// most 16. Empty below feature level 3.
	Holders []Holder
}

func (e *LockedError) Error() string {
	if len(e.Holders) == 0 {
		return fmt.Sprintf("lock %q: %v", e.Key, ErrLocked)
	}
	s := fmt.Sprintf("lock %q: %v: held by", e.Key, ErrLocked)
	for i, h := range e.Holders {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(" %s (session %x, token %d)", h.Peer, h.Session, h.Token)
	}
	return s
}

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// WaitError is what a waiting lock call (Lock, RLock, RWMutex.Lock,
// Semaphore.Acquire, LockAll) returns when its ctx ends before the grant:
// it wraps ctx's error, so errors.Is(err, context.DeadlineExceeded) or
// context.Canceled holds, and, since the key was not refused,
// errors.Is(err, ErrLocked) does not. errors.As gives what the wait was
// behind, as one linearizable read made when ctx ended found it (bounded
// on its own by a quarter of the session TTL, at most a second, before
// the wait is withdrawn): the key, its holders and how many waiters were
// ahead. For a LockAll it names the first key of the shard it waited on
// that somebody held or waited for. Known is false, and the details
// empty, when that read did not answer in time.
type WaitError struct {
	Key string
	// Known is true when the key's state was read.
	Known bool
	// Holders held the key, in grant order, as for LockedError.
	Holders []Holder
	// Ahead is how many waiters were before this one in the key's queue.
	Ahead int
	// Err is ctx's error.
	Err error
}

func (e *WaitError) Error() string {
	if !e.Known {
		return fmt.Sprintf("lock %q: gave up waiting: %v", e.Key, e.Err)
	}
	s := fmt.Sprintf("lock %q: gave up waiting: %v; ", e.Key, e.Err)
	if len(e.Holders) == 0 {
		s += "no holders"
	} else {
		s += "held by"
		for i, h := range e.Holders {
			if i > 0 {
				s += ","
			}
			s += fmt.Sprintf(" %s (session %x, token %d)", h.Peer, h.Session, h.Token)
		}
	}
	return s + fmt.Sprintf(", %d waiting ahead", e.Ahead)
}

// Unwrap returns ctx's error.
func (e *WaitError) Unwrap() error { return e.Err }

// publicErr turns the client's LockedError and WaitError into node's.
func publicErr(err error) error {
	if le, ok := errors.AsType[*lockerr.LockedError](err); ok {
		return &LockedError{Key: le.Key, Holders: holders(le.Holders)}
	}
	if we, ok := errors.AsType[*client.WaitError](err); ok {
		return &WaitError{Key: we.Key, Known: we.Known, Holders: holders(we.Holders), Ahead: we.Ahead, Err: we.Err}
	}
	return err
}

// nilContext refuses a nil ctx, which every call would otherwise panic
// on, naming the call.
func nilContext(ctx context.Context, call string) error {
	if ctx == nil {
		return fmt.Errorf("%w: %s with a nil Context: pass context.Background(), or one with a deadline", ErrInvalidArgument, call)
	}
	return nil
}
