package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = lockfsm.MaxKeyLen

// Lock is a held exclusive lock. Its fencing token orders it against every
// other grant of the same key. Methods are safe for concurrent use.
type Lock struct {
	n     *Node
	s     *session
	key   string
	req   uint64
	token uint64

	once sync.Once
	done chan struct{}
	mu   sync.Mutex
	err  error
}

// Key returns the locked key.
func (l *Lock) Key() string { return l.key }

// Token returns the fencing token of this grant: strictly greater than the
// token of every earlier grant of the same key, across leader changes,
// restarts and retries. Pass it to the protected resource (see Fence).
func (l *Lock) Token() uint64 { return l.token }

// Done is closed when this holder can no longer rely on the lock: its lease
// may have expired (keepalives unacknowledged for TTL minus the margin, on
// the local monotonic clock), the cluster expired its session, the lock was
// unlocked, or the node closed. Err says which.
//
// A timer closes Done when the lease runs out, but Done also compares the
// lease deadline with the clock each time it is called, so a holder that
// was paused (SIGSTOP, a long GC) and checks Done on waking is never told
// its lease is valid because the timer has not run yet.
func (l *Lock) Done() <-chan struct{} {
	l.checkLease()
	return l.done
}

// Err returns nil while the lock is held, then why Done closed:
// ErrLeaseExpired, ErrNotHeld (after Unlock) or ErrClosed. Like Done, it
// checks the lease deadline against the clock.
func (l *Lock) Err() error {
	l.checkLease()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// checkLease loses the lock at once if its session's deadline has passed.
func (l *Lock) checkLease() {
	select {
	case <-l.done:
		return
	default:
	}
	l.s.checkDeadline()
}

func (l *Lock) lose(err error) { l.claim(err) }

// claim closes Done with err and reports whether this call did it, so
// that of two racing ends of a lock exactly one acts on it.
func (l *Lock) claim(err error) (won bool) {
	l.once.Do(func() {
		won = true
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		close(l.done)
	})
	return won
}

// heldErr is the error Unlock and Release return for a lock that is no
// longer held: already unlocked, or its lease was lost.
func (l *Lock) heldErr(err error) error {
	if errors.Is(err, ErrNotHeld) {
		return fmt.Errorf("unlock %q: already unlocked: %w", l.key, ErrNotHeld)
	}
	return fmt.Errorf("unlock %q: %w", l.key, err)
}

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
	if err := l.end(); err != nil {
		return err
	}
	select {
	case o := <-l.releaseInBackground():
		if o.err != nil {
			return fmt.Errorf("unlock %q: %w", l.key, o.err)
		}
		switch o.res.Status {
		case lockfsm.StatusOK:
			return nil
		case lockfsm.StatusNoSession:
			return fmt.Errorf("unlock %q: %w: the session ended before the release reached the cluster", l.key, ErrLeaseExpired)
		case lockfsm.StatusNotHeld:
			return fmt.Errorf("unlock %q: %w", l.key, ErrNotHeld)
		default:
			return fmt.Errorf("unlock %q: %s", l.key, describe(o.res))
		}
	case <-ctx.Done():
		return fmt.Errorf("unlock %q: the release is not known to have committed; it goes on in the background: %w", l.key, ctx.Err())
	}
}

// Release gives the lock up without waiting for the cluster, as
// sync.Mutex.Unlock does: Done closes at once and Err returns ErrNotHeld,
// so the caller must stop using the token when Release returns. The
// release is committed in the background and hands the key to the next
// waiter when it lands, about one Raft commit later; until then nobody
// else can be granted the key, so mutual exclusion is exactly as with
// Unlock. A Lock or TryLock of the same key on this node waits for the
// release to commit first, so it is never refused by its own release.
//
// A release that cannot commit within the session TTL (the shard has no
// quorum) gives up the node's session on the shard: the cluster then frees
// the key when the session expires, as it would after a crash, and the
// node's other locks on that shard report ErrLeaseExpired. Release returns
// the same errors as Unlock for a lock that was already unlocked or lost.
func (l *Lock) Release() error {
	if err := l.end(); err != nil {
		return err
	}
	l.releaseInBackground()
	return nil
}

// end closes Done because the caller gives the lock up, or returns the
// error for a lock that was already given up or lost.
func (l *Lock) end() error {
	if err := l.Err(); err != nil {
		return l.heldErr(err)
	}
	if !l.claim(fmt.Errorf("%w: released", ErrNotHeld)) {
		return l.heldErr(l.Err())
	}
	return nil
}

// releaseInBackground commits the release of l, bounded by the session
// TTL, and sends its outcome on the returned channel (buffered: nobody
// needs to read it). A Lock of the same key on this node waits for it.
func (l *Lock) releaseInBackground() <-chan outcome {
	s, n := l.s, l.n
	out := make(chan outcome, 1)
	done := s.startRelease(l)
	n.goFunc(func() {
		defer s.attempts.EndRelease(l.key, done)
		ctx, cancel := context.WithTimeout(n.ctx, s.owner.ttl)
		defer cancel()
		res, err := s.release(ctx, l.req)
		out <- outcome{res: res, err: err}
		if err != nil && !n.isClosed() {
			s.lose(fmt.Errorf("%w: release of %q on shard %d did not commit: %v", ErrLeaseExpired, l.key, s.shard, err))
			return
		}
		if err == nil && res.Status != lockfsm.StatusOK {
			n.log.Debug("release not applied", "key", l.key, "shard", s.shard, "result", describe(res))
		}
	})
	return out
}

// Lock blocks until key is granted to this caller, in FIFO order among the
// waiters of the key, and returns the held lock. Waiting costs no polling:
// the grant is pushed to this peer by the Raft entry that made it. When ctx
// ends first, the waiter leaves the queue (and a grant that raced the
// cancellation is released), and ctx's error is returned.
//
// A key may carry a hash tag: in "{order-42}/items" only "order-42", the
// bytes between the first '{' and the first '}' after it, picks the shard,
// so every key tagged {order-42} lives in one shard. A key without a tag,
// or with an empty one ("{}x"), is hashed whole. Clusters created before
// hash tags existed hash every key whole, for good: a key never changes
// shard.
func (n *Node) Lock(ctx context.Context, key string) (*Lock, error) {
	return n.acquire(ctx, key, true)
}

// TryLock takes key if it is free and nobody waits for it, and otherwise
// returns an error wrapping ErrLocked at once.
func (n *Node) TryLock(ctx context.Context, key string) (*Lock, error) {
	return n.acquire(ctx, key, false)
}

func (n *Node) acquire(ctx context.Context, key string, wait bool) (*Lock, error) {
	for {
		l, retry, err := n.acquireIn(ctx, key, wait, func(shard uint64) *Session {
			s, err := n.defaultSession(shard)
			if err != nil {
				return nil
			}
			return s
		})
		if !retry {
			return l, err
		}
		// The default session was lost on the way: start over in a new one.
	}
}

// acquireIn takes key in the Session sessionFor gives for the key's shard
// (nil when the node closed). retry is true when that Session was lost on
// the way.
func (n *Node) acquireIn(ctx context.Context, key string, wait bool, sessionFor func(shard uint64) *Session) (l *Lock, retry bool, err error) {
	if err := lockfsm.ValidateKey(key); err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	if n.isClosed() {
		return nil, false, ErrClosed
	}
	p, err := n.waitReady(ctx)
	if err != nil {
		return nil, false, err
	}
	shard := p.ShardOf(key)
	owner := sessionFor(shard)
	if owner == nil {
		return nil, false, ErrClosed
	}
	s, err := owner.shardSession(ctx, shard)
	if err != nil {
		if owner.Err() != nil {
			return nil, true, nil
		}
		return nil, false, fmt.Errorf("lock %q: %w", key, err)
	}
	if err := s.attempts.AwaitRelease(ctx, key, s.lost); err != nil {
		return nil, false, fmt.Errorf("lock %q: wait for this node's release: %w", key, err)
	}
	if s.isLost() {
		return nil, true, nil
	}
	return n.attempt(ctx, s, key, wait)
}

// attempt makes one acquire attempt in session s. retry is true when the
// session was lost on the way and the caller should start over in a new one.
func (n *Node) attempt(ctx context.Context, s *session, key string, wait bool) (l *Lock, retry bool, err error) {
	req := s.attempts.Begin()
	abandoned := false // an abandoned attempt stays pending until its cancel is in
	defer func() {
		if !abandoned {
			s.attempts.Finish(req)
		}
	}()
	waiter := client.WaiterKey{Shard: s.shard, Session: s.id, Req: req}
	granted := n.waiters.Add(waiter)
	defer n.waiters.Remove(waiter)

	res, err := n.apply(ctx, s.shard, lockfsm.Command{
		Op: lockfsm.OpAcquire, Session: s.id, Req: req, Ack: s.attempts.Ack(), Key: key, Wait: wait, Limit: 1,
	})
	if err != nil {
		abandoned = n.abandon(s, req)
		return nil, false, fmt.Errorf("lock %q: %w", key, err)
	}
	switch res.Status {
	case lockfsm.StatusGranted:
		return s.newLock(key, req, res.Token), false, nil
	case lockfsm.StatusLocked:
		return nil, false, fmt.Errorf("lock %q: %w", key, ErrLocked)
	case lockfsm.StatusNoSession:
		s.lose(fmt.Errorf("%w: shard %d no longer knows session %d", ErrLeaseExpired, s.shard, s.id))
		return nil, true, nil
	case lockfsm.StatusQueued:
	default:
		return nil, false, fmt.Errorf("lock %q: %s", key, describe(res))
	}

	// Queued: wait for the grant (see notify.go). A token comes from this
	// peer's own replica; a notice, or the slow re-read that covers lost
	// notices, is checked against the replicated state.
	poll := time.NewTicker(s.owner.ttl / 4)
	defer poll.Stop()
	for {
		select {
		case tok := <-granted:
			if tok != client.Verify {
				return s.newLock(key, req, tok), false, nil
			}
		case <-poll.C:
		case <-s.lost:
			return nil, true, nil
		case <-ctx.Done():
			abandoned = n.abandon(s, req)
			return nil, false, fmt.Errorf("lock %q: %w", key, ctx.Err())
		case <-n.stop:
			return nil, false, ErrClosed
		}
		a, err := n.read(ctx, s.shard, lockQuery{Kind: queryRequest, Session: s.id, Req: req})
		if err != nil {
			continue
		}
		if !a.SessionFound {
			s.lose(fmt.Errorf("%w: shard %d no longer knows session %d", ErrLeaseExpired, s.shard, s.id))
			return nil, true, nil
		}
		if a.Request.State == lockfsm.ReqHeld {
			return s.newLock(key, req, a.Request.Token), false, nil
		}
	}
}

// abandon withdraws an acquire attempt whose caller gave up. Cancel
// dequeues it, or releases it if it was granted meanwhile, so an abandoned
// grant never leaks. It runs in the background, bounded by the session TTL,
// and reports whether it took over finishing req.
//
// A cancel that does not commit in time loses the whole session, as a
// release that does not commit does: the session's keepalives would
// otherwise keep the abandoned request queued, or granted to nobody, for
// as long as this peer lives, and the key with it (seen under delay-drop).
// Losing the session closes it on the cluster, which ends the request.
func (n *Node) abandon(s *session, req uint64) bool {
	if n.isClosed() {
		return false
	}
	n.goFunc(func() {
		defer s.attempts.Finish(req)
		ctx, cancel := context.WithTimeout(n.ctx, s.owner.ttl)
		defer cancel()
		var err error
		if n.hooks.dropCancels != nil && n.hooks.dropCancels() {
			err = errors.New("cancel dropped by a test")
		} else {
			_, err = n.apply(ctx, s.shard, lockfsm.Command{Op: lockfsm.OpCancel, Session: s.id, Target: req})
		}
		if err != nil && !n.isClosed() {
			s.lose(fmt.Errorf("%w: withdrawal of an abandoned lock attempt on shard %d did not commit: %v", ErrLeaseExpired, s.shard, err))
		}
	})
	return true
}

func (s *session) newLock(key string, req, token uint64) *Lock {
	l := &Lock{n: s.n, s: s, key: key, req: req, token: token, done: make(chan struct{})}
	s.mu.Lock()
	err := s.lostErr
	if err == nil {
		s.locks[req] = l
	}
	s.mu.Unlock()
	if err != nil {
		l.lose(err)
	}
	return l
}
