package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = lockfsm.MaxKeyLen

// Lock is a held exclusive lock. Its fencing token orders it against every
// other grant of the same key. Methods are safe for concurrent use.
type Lock struct {
	h *client.Held // the grant, its session and its end
	n *Node        // the node it was taken through
	// given is set once this hold was unlocked or released: a reentrant
	// grant is shared by several Locks, each of which gives up one hold.
	given atomic.Bool
	// obs observes its release; granted is when it was granted
	// (sinceEpoch; 0 when no MeterProvider times holds), and primitive
	// what took it: for the hold time metric.
	obs       *telemetry
	granted   int64
	primitive primitive

	// onGive are the cancels of this hold's Contexts, run when it is
	// given up; nil once it was.
	mu     sync.Mutex
	onGive []func()
	// contended is Contended's channel, made at its first call.
	contended chan struct{}
}

// Key returns the locked key.
func (l *Lock) Key() string { return l.h.Key() }

// Token returns the fencing token of this grant: strictly greater than the
// token of every earlier grant of the same key, across leader changes,
// restarts and retries. Pass it to the protected resource (see Fence).
func (l *Lock) Token() uint64 { return l.h.Token() }

// Done is closed when this holder can no longer rely on the lock: its lease
// may have expired (keepalives unacknowledged for TTL minus the margin, on
// a local clock that counts suspended time), the cluster expired its session, the lock was
// unlocked, or the node closed. Err says which.
//
// A timer closes Done when the lease runs out, but Done also compares the
// lease deadline with the clock each time it is called, so a holder that
// was paused (SIGSTOP, a long GC) and checks Done on waking is never told
// its lease is valid because the timer has not run yet.
func (l *Lock) Done() <-chan struct{} { return l.h.Done() }

// Err returns nil while the lock is held, then why Done closed:
// ErrLeaseExpired, ErrNotHeld (after Unlock) or ErrClosed. Like Done, it
// checks the lease deadline against the clock.
func (l *Lock) Err() error { return l.h.Err() }

// Unlock releases the lock and, in the same Raft entry, grants it to the
// next waiter, and waits until the release has committed or ctx ends.
//
// Whatever the outcome, the lock is over for the caller once Unlock is
// called: Done closes before the release is proposed, and Err returns
// ErrNotHeld. A release that has not committed when ctx ends goes on in the
// background, exactly as with Release; Unlock then returns an error
// wrapping ctx's error that says the release is not known to have
// committed (the key stays held in the cluster until it commits, or until
// the session expires if it never can). A nil error means the release
// committed.
//
// Unlock returns an error wrapping ErrLeaseExpired when the lease was lost
// before the call (another holder may have been granted the key
// meanwhile), and ErrNotHeld when the lock was already unlocked.
func (l *Lock) Unlock(ctx context.Context) error {
	if err := nilContext(ctx, "Lock.Unlock"); err != nil {
		return err
	}
	if last, err := l.give(); !last {
		return err
	}
	if !l.obs.enabled() {
		return l.h.Unlock(ctx)
	}
	ctx, span := l.obs.startRelease(ctx, "lockmesh.Unlock", l)
	err := l.h.Unlock(ctx)
	l.obs.endRelease(ctx, span, l, err)
	return err
}

// give gives up this Lock's hold and reports whether it was the last
// hold of its grant (always, unless the Session is reentrant); a Lock
// given up before fails with ErrNotHeld.
func (l *Lock) give() (last bool, err error) {
	if l.given.Swap(true) {
		// As the grant's own Unlock says: why it ended, if not by this.
		if err := l.h.Err(); err != nil && !errors.Is(err, ErrNotHeld) {
			return false, fmt.Errorf("unlock %q: %w", l.Key(), err)
		}
		return false, fmt.Errorf("unlock %q: already unlocked: %w", l.Key(), ErrNotHeld)
	}
	l.mu.Lock()
	cancels := l.onGive
	l.onGive = nil
	l.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
	if !l.h.Leave() {
		return false, nil
	}
	return true, nil
}

// Value returns the value this hold carries: what WithValue gave, or
// the last SetValue that committed (nil for none).
func (l *Lock) Value() []byte { return slices.Clone(l.h.Spec().Value) }

// SetValue replaces the value this hold carries (WithValue), for Inspect
// and Watch to show, once the change commits. It is fenced on the grant:
// the cluster takes it only while this grant holds the key, so a holder
// that lost the key never writes over its successor's value. A lock this
// holder no longer relies on (Done closed: unlocked, or its lease lost)
// fails with Err's error before anything is sent; one the cluster no
// longer counts a holder, with ErrNotHeld. A nil or empty v clears the
// value; a longer one than MaxValueLen is ErrInvalidArgument. Every hold
// of a reentrant grant shares its value. Needs feature level 4.
func (l *Lock) SetValue(ctx context.Context, v []byte) error {
	if err := nilContext(ctx, "Lock.SetValue"); err != nil {
		return err
	}
	if err := checkValue("SetValue", v); err != nil {
		return err
	}
	if l.given.Load() {
		return fmt.Errorf("set the value of %q: %w: this hold was given up", l.Key(), ErrNotHeld)
	}
	return l.h.SetValue(ctx, v)
}

// Contended returns a channel that is closed once somebody waits for the
// key while this lock holds it (Chubby's "someone is waiting"), so that a
// long holder can finish up and let go. The first call starts a watch of
// the key (Watch), which ends with the hold; the channel stays open if
// nobody queues before then, if the watch fails, or below feature level
// 4, where there are no watches. Every call returns the same channel.
func (l *Lock) Contended() <-chan struct{} {
	l.mu.Lock()
	if l.contended != nil {
		l.mu.Unlock()
		return l.contended
	}
	ch := make(chan struct{})
	l.contended = ch
	l.mu.Unlock()
	if !l.n.peer.ClusterLevel().HasCoordination() {
		return ch
	}
	ctx := l.Context(context.Background())
	go func() {
		watch, err := l.n.Watch(ctx, l.Key())
		if err != nil {
			return
		}
		for r := range watch {
			queued := false
			for _, k := range r.Keys {
				queued = queued || len(k.Waiters) > 0
			}
			for _, e := range r.Events {
				queued = queued || e.Kind == Queued
			}
			if queued {
				close(ch)
				break
			}
		}
		for range watch { // until the hold ends and the watch with it
		}
	}()
	return ch
}

// Permits returns how many permits this grant holds: what Semaphore's
// Acquire asked for, and 1 for every other lock.
func (l *Lock) Permits() int { return int(max(l.h.Spec().Permits, 1)) }

// Release gives the lock up without waiting for the cluster, as
// sync.Mutex.Unlock does: Done closes at once and Err returns ErrNotHeld,
// so the caller must stop using the token when Release returns. The
// release is committed in the background and hands the key to the next
// waiter when it lands, about one Raft commit later; until then nobody
// else can be granted the key, so mutual exclusion is exactly as with
// Unlock. A Lock or TryLock of the same key through the same session (the
// Session the lock was taken through; for Node.Lock's locks, the node's
// default session of the key's shard) made once Release was called, from
// any goroutine, waits for the release to commit first: it is never
// refused by its own release, nor told the key is still held. Through
// another Session the key is held until the release commits.
//
// A release that cannot commit within the session TTL (the shard has no
// quorum) gives up the node's session on the shard: the cluster then frees
// the key when the session expires, as it would after a crash, and the
// node's other locks on that shard report ErrLeaseExpired. Release returns
// the same errors as Unlock for a lock that was already unlocked or lost.
func (l *Lock) Release() error {
	if last, err := l.give(); !last {
		return err
	}
	if !l.obs.enabled() {
		return l.h.Release()
	}
	ctx, span := l.obs.startRelease(context.Background(), "lockmesh.Release", l)
	err := l.h.Release()
	l.obs.endRelease(ctx, span, l, err)
	return err
}

// Lock blocks until key is granted to this caller, in FIFO order among the
// waiters of the key, and returns the held lock. The grant is pushed to
// this peer by the Raft entry that made it, so a waiter learns of it
// within a round trip; since a push can be lost, a waiter also re-reads
// its request's state every TTL/4 (one small read per waiter, not a
// retry of the lock: its place in the queue is kept). When ctx
// ends first, the waiter leaves the queue (and a grant that raced the
// cancellation is released), and a *WaitError is returned: it wraps
// ctx's error and says whom the wait was behind. A Lock of the key
// through the same session right after waits for that withdrawal to
// commit, so it never queues behind its own abandoned attempt.
//
// A key may carry a hash tag: in "{order-42}/items" only "order-42", the
// bytes between the first '{' and the first '}' after it, picks the shard,
// so every key tagged {order-42} lives in one shard. A key without a tag,
// or with an empty one ("{}x"), is hashed whole. Clusters created before
// hash tags existed hash every key whole, for good: a key never changes
// shard.
func (n *Node) Lock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "Node.Lock"); err != nil {
		return nil, err
	}
	return n.acquire(ctx, key, true, opts)
}

// TryLock takes key if it is free and nobody waits for it, and otherwise
// returns an error wrapping ErrLocked at once; from feature level 3 it is
// a *LockedError naming the holders.
func (n *Node) TryLock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "Node.TryLock"); err != nil {
		return nil, err
	}
	return n.acquire(ctx, key, false, opts)
}

// acquire takes key in the node's default session of its shard.
func (n *Node) acquire(ctx context.Context, key string, wait bool, opts []LockOption) (l *Lock, err error) {
	ctx, call := n.obs.startAcquire(ctx, primitiveMutex, wait, key)
	defer func() { call.endLock(ctx, l, err) }()
	spec, err := n.spec(client.Spec{}, opts)
	if err != nil {
		return nil, err
	}
	if n.peer.ClusterLevel().HasLockFamily() {
		// No deadlock check: the default session is shared by every
		// goroutine of the node, so its waits are not one thread's.
		spec.Flags = lockfsm.FlagDetail
	}
	shard, err := n.shardFor(ctx, key)
	if err != nil {
		return nil, err
	}
	for {
		cs, err := n.client.Default(shard)
		if err != nil {
			return nil, ErrClosed
		}
		h, retry, err := cs.Acquire(ctx, shard, key, wait, spec)
		if retry {
			continue // the default session was lost on the way: start over in a new one
		}
		if h == nil {
			return nil, publicErr(err)
		}
		return &Lock{h: h, n: n, obs: n.obs}, nil
	}
}

// shardFor checks key and returns its shard once the cluster layout is
// known.
func (n *Node) shardFor(ctx context.Context, key string) (uint64, error) {
	if err := lockfsm.ValidateKey(key); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	if n.peer.IsClosed() {
		return 0, ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
	if err != nil {
		return 0, err
	}
	return p.ShardOf(key), nil
}
