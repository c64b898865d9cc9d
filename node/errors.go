package node

import "errors"

// Sentinel errors returned by the node API. Check them with errors.Is; the
// returned errors wrap them with the key, shard or peer involved.
var (
	// ErrLocked is returned by TryLock when the key is held by someone else
	// (or others are already queued for it).
	ErrLocked = errors.New("lockmesh: key is locked")
	// ErrLeaseExpired means the lease of the session that held the lock may
	// have expired: keepalives were not acknowledged within the TTL, or the
	// cluster expired the session. Stop touching the protected resource.
	ErrLeaseExpired = errors.New("lockmesh: lease expired")
	// ErrNotHeld is returned by Unlock when the lock is no longer held, for
	// example because it was already unlocked.
	ErrNotHeld = errors.New("lockmesh: lock not held")
	// ErrClosed is returned by calls made after Close, and by Lock.Err for
	// a lock held when its node closed.
	ErrClosed = errors.New("lockmesh: node closed")
	// ErrInvalidKey is returned for an empty or oversized key.
	ErrInvalidKey = errors.New("lockmesh: invalid key")
	// ErrInvalidConfig is returned by Config.Validate and Start.
	ErrInvalidConfig = errors.New("lockmesh: invalid config")
	// ErrUnavailable means the shard owning a key could not be reached before
	// the context ended: not enough peers are up or the network is cut.
	ErrUnavailable = errors.New("lockmesh: shard unavailable")
	// ErrStaleToken is returned by Fence.Check for a token lower than one
	// already seen for the same key.
	ErrStaleToken = errors.New("lockmesh: stale fencing token")
)
