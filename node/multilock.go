package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

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
		var once sync.Once
		for _, l := range m.locks {
			l.h.AfterDone(func() { once.Do(func() { close(m.done) }) })
		}
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
	if err := nilContext(ctx, "MultiLock.Unlock"); err != nil {
		return err
	}
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
	if err := nilContext(ctx, "Session.LockAll"); err != nil {
		return nil, err
	}
	return s.lockAll(ctx, keys, true)
}

// TryLockAll takes every key if all of them are free now, and otherwise
// takes none and fails with a *LockedError for a key it could not take:
// of the shard that refused, the first key somebody held, with its
// holders (or, if the cluster named none, the shard's first key).
func (s *Session) TryLockAll(ctx context.Context, keys ...string) (*MultiLock, error) {
	if err := nilContext(ctx, "Session.TryLockAll"); err != nil {
		return nil, err
	}
	return s.lockAll(ctx, keys, false)
}

func (s *Session) lockAll(ctx context.Context, keys []string, wait bool) (m *MultiLock, err error) {
	ctx, call := s.n.obs.startAcquire(ctx, primitiveMulti, wait, keys...)
	defer func() {
		var locks []*Lock
		if m != nil {
			locks = m.locks
		}
		call.end(ctx, locks, err)
	}()
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
	if n.peer.IsClosed() {
		return nil, ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
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
		if s.cs.Holds(shard, key) {
			return nil, fmt.Errorf("lock all: lock %q: %w: unlock it first, or lock through another Session (LockAll never re-enters a key)", key, ErrAlreadyHeld)
		}
		byShard[shard] = append(byShard[shard], key)
	}
	shards := slices.Sorted(maps.Keys(byShard))
	held := map[string]*Lock{}
	giveBack := func() {
		if n.peer.Hooks().UnsafeKeepPartialLockAll {
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
		hs, retry, err := s.cs.AcquireAll(ctx, shard, group, specs, wait)
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
			held[h.Key()] = &Lock{h: h, n: n, obs: n.obs}
		}
	}
	m = &MultiLock{locks: make([]*Lock, len(keys))}
	for i, key := range keys {
		m.locks[i] = held[key]
	}
	return m, nil
}
