package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Session is a lease on the cluster that the locks taken through it belong
// to, as in etcd's concurrency.Session. It holds one replicated session on
// each shard it has taken a lock on, all kept alive by this node's one
// keepalive loop and all ending together: when any of them is lost (its
// keepalives went unacknowledged for the TTL, or the cluster expired it),
// the whole Session is, Done closes, every lock taken through it reports
// the loss on its own Done, and the rest are closed on the cluster so
// their keys pass on at once.
//
// Node.Lock and Node.TryLock use the node's default sessions instead: one
// per shard with Config.SessionTTL, each replaced by a new one when lost,
// so a loss on one shard does not end locks on another.
//
// A Session that locks a key it holds as a mutex, read or write lock
// fails at once with ErrAlreadyHeld (it would otherwise wait for itself),
// unless it is reentrant and locks the key as the kind it holds it (see
// WithReentrant). A semaphore's permits it may take several times over,
// each take a grant of its own (see Semaphore); LockAll never re-enters a
// key. A lock the Session is giving up (Unlock or Release called, its
// maximum hold reached) is no longer held: locking its key again waits
// for the release to commit and takes the key anew, with a new token; so
// does locking a key right after a wait for it gave up (its withdrawal
// commits first).
//
// A Session is safe for concurrent use.
type Session struct {
	n  *Node
	cs *client.Session // its replicated sessions, leases and end

	mu        sync.Mutex
	campaigns map[string]*campaignRecord // the elections it campaigns in (Campaign)
}

// SessionOption configures NewSession.
type SessionOption func(*sessionOptions)

type sessionOptions struct {
	ttl       time.Duration
	reentrant bool
}

// WithReentrant lets the session lock a key it holds again as the kind
// it holds it: a mutex (Session.Lock), a write lock (RWMutex.Lock) or a
// read lock (RWMutex.RLock). It gets the same grant, with the same
// fencing token, and one more hold; the key is released when every hold
// is unlocked. Each *Lock returned is one hold, and unlocking one twice
// fails with ErrNotHeld, so a hold cannot be given up twice by mistake.
// Re-locking as another kind, a read lock held and the write lock asked
// (an upgrade) or the reverse, still fails with ErrAlreadyHeld. Once the
// last hold is unlocked the grant is over: a re-lock in that moment (from
// another goroutine) does not re-enter it, but waits for its release and
// takes the key anew, with a new token. It changes nothing for
// semaphores, whose permits any Session may take several times over, each
// take a grant of its own (see Semaphore), nor for LockAll, which never
// re-enters a key: a key the session holds fails it with ErrAlreadyHeld.
//
// It is off by default, as in etcd's concurrency package: a critical
// section entered again usually hides a bug (the inner one breaks the
// invariants the outer one relies on), and the hold count belongs to the
// Session, not to a goroutine, so goroutines that share a reentrant
// Session share its holds: one of them can re-enter a lock another holds.
// Give each goroutine its own Session if that matters.
func WithReentrant() SessionOption {
	return func(o *sessionOptions) { o.reentrant = true }
}

// WithTTL sets the session's time to live: how long the cluster keeps its
// locks after its keepalives stop (a crash, a partition). It must be at
// least 40 RTT and more than twice Config.LeaseMargin, and at most
// MaxSessionTTL. The default is
// Config.SessionTTL. A holder gives its lease up Config.LeaseMargin, or a
// tenth of the TTL if that is longer, before the TTL runs out.
func WithTTL(d time.Duration) SessionOption {
	return func(o *sessionOptions) { o.ttl = d }
}

// NewSession starts a session. It does no I/O: the session opens on each
// shard at its first lock there. It fails with ErrInvalidConfig for a TTL
// out of range and ErrClosed after Close; ctx is for future options that
// do I/O.
func (n *Node) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	if err := nilContext(ctx, "Node.NewSession"); err != nil {
		return nil, err
	}
	o := sessionOptions{ttl: n.cfg.SessionTTL}
	for _, opt := range opts {
		opt(&o)
	}
	if min := max(40*n.cfg.RTT, 2*n.cfg.LeaseMargin+time.Millisecond); o.ttl < min {
		return nil, fmt.Errorf("%w: session TTL %v is below %v (40 RTT, and more than twice LeaseMargin)", ErrInvalidConfig, o.ttl, min)
	}
	if o.ttl > MaxSessionTTL {
		return nil, fmt.Errorf("%w: session TTL %v is above MaxSessionTTL (%v): peers refuse longer sessions", ErrInvalidConfig, o.ttl, MaxSessionTTL)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s, err := n.newSession(o.ttl)
	if err == nil && o.reentrant {
		s.cs.SetReentrant()
	}
	return s, err
}

func (n *Node) newSession(ttl time.Duration) (*Session, error) {
	o, err := n.client.NewSession(ttl)
	if err != nil {
		return nil, err
	}
	return &Session{n: n, cs: o}, nil
}

// TTL returns the session's time to live.
func (s *Session) TTL() time.Duration { return s.cs.TTL() }

// ID returns the session's id: random, never 0, and the same on every
// shard, so Inspect shows it (Holder.Session) for each of its locks and
// waits. Its locks on a shard are held by a replicated session of that
// shard, whose own id Inspect shows as Holder.ShardSession. A cluster
// records the id from feature level 3 on; sessions opened on a shard
// before it runs at level 3 show 0 there.
func (s *Session) ID() uint64 { return s.cs.Label() }

// Done is closed when the session ends: lost (ErrLeaseExpired), closed
// (ErrSessionClosed) or ended with its node (ErrClosed). Err says which.
func (s *Session) Done() <-chan struct{} { return s.cs.Done() }

// Err returns nil while the session lives, then why Done closed.
func (s *Session) Err() error { return s.cs.Err() }

// Lock takes key for this session; see Node.Lock. It fails with an error
// wrapping ErrLeaseExpired or ErrSessionClosed once the session has ended,
// and at once with ErrAlreadyHeld for a key the session holds (unless the
// session is reentrant, see WithReentrant). From feature level 3 a wait
// that would close a cycle of Sessions each waiting for what the next
// holds fails with ErrDeadlock (at once within a shard, within about a
// second across shards: docs/LOCKS.md), and a wait whose ctx ends returns
// a *WaitError.
func (s *Session) Lock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "Session.Lock"); err != nil {
		return nil, err
	}
	return s.acquire(ctx, key, true, client.Spec{}, opts)
}

// TryLock takes key for this session if it is free; see Node.TryLock.
func (s *Session) TryLock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "Session.TryLock"); err != nil {
		return nil, err
	}
	return s.acquire(ctx, key, false, client.Spec{}, opts)
}

// acquire takes key in s as spec asks; from feature level 3 a refusal
// names the holders, and a wait that closes a cycle of Sessions is
// refused (a Session is one thread of control: see WithReentrant).
func (s *Session) acquire(ctx context.Context, key string, wait bool, spec client.Spec, opts []LockOption) (l *Lock, err error) {
	return s.acquireChecked(ctx, key, wait, spec, opts, true)
}

// acquireChecked is acquire; a wait is deadlock-checked only with checked
// (and without a priority, which passes unchecked waiters only).
func (s *Session) acquireChecked(ctx context.Context, key string, wait bool, spec client.Spec, opts []LockOption, checked bool) (l *Lock, err error) {
	ctx, call := s.n.obs.startAcquire(ctx, primitiveOf(spec), wait, key)
	defer func() { call.endLock(ctx, l, err) }()
	if spec, err = s.n.spec(spec, opts); err != nil {
		return nil, err
	}
	if s.n.peer.ClusterLevel().HasLockFamily() {
		spec.Flags |= lockfsm.FlagDetail
		if checked && spec.Priority == 0 {
			spec.Flags |= lockfsm.FlagDeadlock
		}
	}
	shard, err := s.n.shardFor(ctx, key)
	if err != nil {
		return nil, err
	}
	h, retry, err := s.cs.Acquire(ctx, shard, key, wait, spec)
	if retry {
		if err = s.Err(); err == nil {
			err = fmt.Errorf("%w: session lost", ErrLeaseExpired)
		}
		return nil, fmt.Errorf("lock %q: the Session has ended, and every call through it fails: open a new one (NewSession): %w", key, err)
	}
	if h == nil {
		return nil, publicErr(err)
	}
	return &Lock{h: h, n: s.n, obs: s.n.obs}, nil
}

// Close ends the session now: its locks' Done close (ErrSessionClosed),
// then the session is closed on every shard it used, which releases its
// locks and hands them to their next waiters in the same Raft entry.
// Close waits for those closes until ctx ends; a close that has not
// committed by then goes on in the background, and Close returns an error
// saying so (the cluster frees the keys when the TTL runs out at the
// latest). Close is idempotent.
func (s *Session) Close(ctx context.Context) error {
	if err := nilContext(ctx, "Session.Close"); err != nil {
		return err
	}
	return s.cs.Close(ctx)
}

// Orphan stops the session's keepalives without closing it: the cluster
// frees its locks when its TTL runs out, and their Done (and the
// session's) close when the lease can no longer be relied on, as after a
// crash. Use it to hand the locks' fate to the TTL, for example when this
// process is about to exit and another will take over. A Close after
// Orphan still releases the locks at once.
func (s *Session) Orphan() { s.cs.Orphan() }
