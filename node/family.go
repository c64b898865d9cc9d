package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// The lock family beyond the mutex: read/write locks, counting
// semaphores and locks over several keys, each held through a Session
// with the mutex's guarantees (FIFO queues in the replicated state, the
// grant in the Raft entry that frees the key, a fencing token per grant,
// Done and Err per held lock). They need the cluster at feature level 3:
// until every peer runs a release that speaks it, they fail with
// ErrIncompatible and mutexes go on. docs/LOCKS.md says what was chosen
// where the usual libraries differ.

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

// familyLevel refuses the lock family below feature level 3: a replica
// of an older release would halt on its commands.
func (n *Node) familyLevel(what string) error {
	if n.labels() {
		return nil
	}
	return fmt.Errorf("%w: %s need feature level %d; the cluster runs at %d until every peer is upgraded (see docs/UPGRADING.md)",
		ErrIncompatible, what, labelLevel, n.clusterLevel())
}

// LockOption configures one lock call (Lock, TryLock, RLock, Acquire and
// their Try forms).
type LockOption func(*lockOptions)

type lockOptions struct {
	maxHold time.Duration
}

// MaxHold is the longest maximum hold WithMaxHold accepts.
const MaxHold = 24 * time.Hour

// WithMaxHold bounds how long the lock may be held: d after it was asked
// for (or, for a waiter, after it last saw it was still waiting), the
// cluster takes it back exactly as if its session had expired, even while
// the session's keepalives still run, so a process stuck in a loop or a
// GC spiral cannot hold a key for ever. As with a lost lease, the
// holder's Done closes first, a margin before (LeaseMargin, or d/10 if
// that is longer), with Err wrapping ErrLeaseExpired; the release is then
// sent at once. d must be at least 40 RTT and more than twice
// LeaseMargin, and at most MaxHold. The session's other locks are not
// affected. A reentrant re-lock keeps the first lock's maximum. Needs
// feature level 3.
func WithMaxHold(d time.Duration) LockOption {
	return func(o *lockOptions) { o.maxHold = d }
}

// spec applies opts to spec, checking them against n's config.
func (n *Node) spec(spec client.Spec, opts []LockOption) (client.Spec, error) {
	var o lockOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxHold == 0 {
		return spec, nil
	}
	if least := max(40*n.cfg.RTT, 2*n.cfg.LeaseMargin+time.Millisecond); o.maxHold < least || o.maxHold > MaxHold {
		return spec, fmt.Errorf("%w: WithMaxHold(%v): a maximum hold is %v (40 RTT, and more than twice LeaseMargin) to %v", ErrInvalidArgument, o.maxHold, least, MaxHold)
	}
	if err := n.familyLevel("maximum hold times"); err != nil {
		return spec, err
	}
	spec.MaxHold = o.maxHold
	return spec, nil
}

// RWMutex is a read/write lock on one key for a Session, as etcd's
// recipe and Curator's InterProcessReadWriteLock: any number of readers
// or one writer. It is fair: a queued writer blocks the readers that
// arrive after it, so writers never starve, and a writer's release hands
// the key, in one Raft entry, to the whole run of readers at the head of
// the queue. Every grant, read or write, gets a fencing token above every
// earlier grant of the key (a writer's is above every earlier reader's),
// so Fence works with both. Get one with Session.RWMutex.
type RWMutex struct {
	s   *Session
	key string
}

// RWMutex returns the read/write lock on key for this session. It does
// no I/O. A key is one kind of lock while anybody holds or waits for it:
// locking a read/write key as a mutex or a semaphore fails with
// ErrKindMismatch.
func (s *Session) RWMutex(key string) *RWMutex { return &RWMutex{s: s, key: key} }

// RLock blocks until the key is granted to this session for reading,
// behind any writer that holds it or waits for it, and returns the held
// read lock. ctx ends the wait as for Node.Lock.
func (m *RWMutex) RLock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return m.lock(ctx, lockfsm.KindRead, true, opts)
}

// TryRLock takes the key for reading if no writer holds or waits for it,
// and otherwise fails at once with a *LockedError.
func (m *RWMutex) TryRLock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return m.lock(ctx, lockfsm.KindRead, false, opts)
}

// Lock blocks until the key is granted to this session for writing: no
// reader or writer holds it. It queues behind those that came first.
func (m *RWMutex) Lock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return m.lock(ctx, lockfsm.KindWrite, true, opts)
}

// TryLock takes the key for writing if nobody holds or waits for it, and
// otherwise fails at once with a *LockedError.
func (m *RWMutex) TryLock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	return m.lock(ctx, lockfsm.KindWrite, false, opts)
}

func (m *RWMutex) lock(ctx context.Context, kind lockfsm.Kind, wait bool, opts []LockOption) (*Lock, error) {
	if err := m.s.n.familyLevel("read/write locks"); err != nil {
		return nil, err
	}
	return m.s.acquire(ctx, m.key, wait, client.Spec{Kind: kind}, opts)
}

// Semaphore is a counting semaphore on one key for a Session: at most
// its permit count of permits are held at once, across the cluster. As
// every lock of a Session, permits are leased: a holder that dies gives
// them back when its session's TTL runs out (Redisson's RSemaphore and
// Curator's first semaphore kept them for ever). Requests are granted in
// FIFO order, a request waiting for more permits than are free holding
// back smaller ones behind it, so a large request is never starved. Get
// one with Session.Semaphore.
//
// A Session may take permits of one semaphore several times over,
// reentrant or not (WithReentrant changes nothing here): each take is a
// grant of its own, with its own token and Unlock, as goroutines sharing
// the Session would take them (Curator's InterProcessSemaphoreV2 and
// Redisson's RSemaphore do the same). A take that needs the Session's own
// permits back can never be granted while the Session waits, and fails at
// once with ErrDeadlock: the Session is one thread of control, its
// goroutines included, so goroutines that should wait for each other's
// permits need Sessions of their own.
type Semaphore struct {
	s       *Session
	key     string
	permits int
}

// Semaphore returns the semaphore on key with permits permits for this
// session. It does no I/O. Every user of a key must give the same permit
// count while anybody holds or waits for it; another count fails with
// ErrLimitMismatch, naming both, rather than setting a new limit. Once
// nobody holds or waits for the key the count is forgotten: that is how a
// semaphore's size is changed (docs/LOCKS.md).
func (s *Session) Semaphore(key string, permits int) *Semaphore {
	return &Semaphore{s: s, key: key, permits: permits}
}

// Acquire blocks until n permits are granted to this session and returns
// them as one held *Lock, whose Unlock or Release gives all n back. ctx
// ends the wait as for Node.Lock (a *WaitError). Permits the session
// holds already do not count towards n: they stay held by their own
// takes.
func (m *Semaphore) Acquire(ctx context.Context, n int, opts ...LockOption) (*Lock, error) {
	return m.acquire(ctx, n, true, opts)
}

// TryAcquire takes n permits if they are free and nobody waits before
// it, and otherwise fails at once with a *LockedError naming the holders.
func (m *Semaphore) TryAcquire(ctx context.Context, n int, opts ...LockOption) (*Lock, error) {
	return m.acquire(ctx, n, false, opts)
}

func (m *Semaphore) acquire(ctx context.Context, n int, wait bool, opts []LockOption) (*Lock, error) {
	switch {
	case m.permits <= 0 || m.permits > 1<<31-1:
		return nil, fmt.Errorf("%w: semaphore %q: %d permits; a semaphore has 1 to %d", ErrInvalidArgument, m.key, m.permits, 1<<31-1)
	case n <= 0:
		return nil, fmt.Errorf("%w: semaphore %q: acquire of %d permits; acquire at least 1", ErrInvalidArgument, m.key, n)
	case n > m.permits:
		return nil, fmt.Errorf("%w: semaphore %q: acquire of %d permits, more than its %d", ErrInvalidArgument, m.key, n, m.permits)
	}
	if err := m.s.n.familyLevel("semaphores"); err != nil {
		return nil, err
	}
	return m.s.acquire(ctx, m.key, wait, client.Spec{Kind: lockfsm.KindSemaphore, Limit: uint32(m.permits), Permits: uint32(n)}, opts)
}

// MaxLockAll is the most keys one LockAll takes.
const MaxLockAll = lockfsm.MaxGroup

// MultiLock is the keys a LockAll holds. Methods are safe for concurrent
// use.
type MultiLock struct {
	locks []*Lock // in the order of the keys given

	doneOnce sync.Once
	done     chan struct{}
}

// Locks returns the held locks, one per key in the order LockAll was
// given them, each with its own fencing token.
func (m *MultiLock) Locks() []*Lock { return slices.Clone(m.locks) }

// Done is closed when any of the locks can no longer be relied on: the
// locks of each shard belong to that shard's session, which ends on its
// own.
func (m *MultiLock) Done() <-chan struct{} {
	m.doneOnce.Do(func() {
		m.done = make(chan struct{})
		cases := make([]reflect.SelectCase, len(m.locks))
		for i, l := range m.locks {
			cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(l.Done())}
		}
		go func() {
			reflect.Select(cases) // every lock ends, at the latest with its node
			close(m.done)
		}()
	})
	// Each lock's Done checks its lease against the clock; so does this.
	for _, l := range m.locks {
		select {
		case <-l.Done():
			<-m.done
		default:
		}
	}
	return m.done
}

// Err returns nil while every lock is held, then the first lock's error.
func (m *MultiLock) Err() error {
	for _, l := range m.locks {
		if err := l.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Unlock releases every lock, waiting as Lock.Unlock does, and returns
// the errors of those that failed, joined. The releases go out together,
// so those of one shard share a Raft entry and Unlock costs about one
// commit, not one per key.
func (m *MultiLock) Unlock(ctx context.Context) error {
	errs := make([]error, len(m.locks))
	var wg sync.WaitGroup
	for i, l := range m.locks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Unlock(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Release gives every lock up without waiting, as Lock.Release does.
func (m *MultiLock) Release() error {
	errs := make([]error, len(m.locks))
	for i, l := range m.locks {
		errs[i] = l.Release()
	}
	return errors.Join(errs...)
}

// LockAll takes every key for this session, as mutexes, and returns them
// held together. Keys on one shard (give related keys a common hash tag,
// "{order-42}/items") are taken all or nothing in one Raft entry: the
// group waits, whole, until every key is free for it. Keys on several
// shards are taken shard by shard, in ascending shard order, which every
// LockAll follows, so two LockAll calls never deadlock each other. If a
// shard refuses, or ctx ends, or the session ends, what was taken is
// released and nothing is left held or queued; the error says which key
// failed (when ctx ended, a *WaitError for a key it waited for).
//
// Keys must be distinct, at most MaxLockAll of them. LockAll is never
// reentrant: a key the session holds already, as any kind of lock and
// whether or not the session is reentrant, fails it with ErrAlreadyHeld
// before anything is sent.
func (s *Session) LockAll(ctx context.Context, keys ...string) (*MultiLock, error) {
	return s.lockAll(ctx, keys, true)
}

// TryLockAll takes every key if all of them are free now, and otherwise
// takes none and fails with a *LockedError for a key it could not take:
// of the shard that refused, the first key somebody held, with its
// holders (or, if the cluster named none, the shard's first key).
func (s *Session) TryLockAll(ctx context.Context, keys ...string) (*MultiLock, error) {
	return s.lockAll(ctx, keys, false)
}

func (s *Session) lockAll(ctx context.Context, keys []string, wait bool) (*MultiLock, error) {
	if !s.n.obs.enabled() {
		return s.lockAllObserved(ctx, keys, wait)
	}
	ctx, call := s.n.obs.startAcquire(ctx, primitiveMulti, wait, keys...)
	m, err := s.lockAllObserved(ctx, keys, wait)
	var locks []*Lock
	if m != nil {
		locks = m.locks
	}
	call.end(ctx, locks, err)
	return m, err
}

func (s *Session) lockAllObserved(ctx context.Context, keys []string, wait bool) (*MultiLock, error) {
	n := s.n
	switch {
	case len(keys) == 0:
		return nil, fmt.Errorf("%w: LockAll of no keys", ErrInvalidArgument)
	case len(keys) > MaxLockAll:
		return nil, fmt.Errorf("%w: LockAll of %d keys, more than MaxLockAll (%d)", ErrInvalidArgument, len(keys), MaxLockAll)
	}
	seen := make(map[string]bool, len(keys))
	for _, key := range keys {
		if err := lockfsm.ValidateKey(key); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrInvalidKey, err)
		}
		if seen[key] {
			return nil, fmt.Errorf("%w: LockAll of %q twice", ErrInvalidArgument, key)
		}
		seen[key] = true
	}
	if n.isClosed() {
		return nil, ErrClosed
	}
	p, err := n.waitReady(ctx)
	if err != nil {
		return nil, err
	}
	if err := n.familyLevel("LockAll"); err != nil {
		return nil, err
	}
	// FlagDetail: a refused TryLockAll names who holds its key.
	spec := client.Spec{Flags: lockfsm.FlagDetail | lockfsm.FlagDeadlock}
	byShard := map[uint64][]string{}
	for _, key := range keys {
		shard := p.ShardOf(key)
		// Never reentrant, on any shard: a key held already fails the
		// whole LockAll before any shard is asked for anything.
		// (AcquireAll checks again, for a key locked meanwhile.)
		if s.o.Holds(shard, key) {
			return nil, fmt.Errorf("lock all: lock %q: %w: unlock it first, or lock through another Session (LockAll never re-enters a key)", key, ErrAlreadyHeld)
		}
		byShard[shard] = append(byShard[shard], key)
	}
	shards := slices.Sorted(maps.Keys(byShard))
	held := map[string]*Lock{}
	giveBack := func() {
		if n.hooks.unsafeKeepPartialLockAll {
			return
		}
		for _, l := range held {
			_ = l.Release() // committed in the background
		}
	}
	for _, shard := range shards {
		group := slices.Sorted(slices.Values(byShard[shard]))
		specs := make([]client.Spec, len(group))
		for i := range specs {
			specs[i] = spec
		}
		// AcquireAll for one key too: Acquire would re-enter it.
		hs, retry, err := s.o.AcquireAll(ctx, shard, group, specs, wait)
		if retry {
			if err = s.Err(); err == nil {
				err = fmt.Errorf("%w: session lost", ErrLeaseExpired)
			}
			err = fmt.Errorf("lock all: %w", err)
		}
		if err != nil {
			giveBack()
			return nil, publicErr(err)
		}
		for _, h := range hs {
			held[h.Key()] = &Lock{h: h, obs: n.obs}
		}
	}
	m := &MultiLock{locks: make([]*Lock, len(keys))}
	for i, key := range keys {
		m.locks[i] = held[key]
	}
	return m, nil
}
