package node

import (
	"errors"

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
	ErrInvalidKey = errors.New("lockmesh: invalid key")
	// ErrInvalidConfig is returned by Config.Validate and Start.
	ErrInvalidConfig = errors.New("lockmesh: invalid config")
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
	ErrIncompatible = errors.New("lockmesh: incompatible version")
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
