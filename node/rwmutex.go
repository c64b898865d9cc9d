package node

import (
	"context"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

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
	if err := nilContext(ctx, "RWMutex.RLock"); err != nil {
		return nil, err
	}
	return m.lock(ctx, lockfsm.KindRead, true, opts)
}

// TryRLock takes the key for reading if no writer holds or waits for it,
// and otherwise fails at once with a *LockedError.
func (m *RWMutex) TryRLock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "RWMutex.TryRLock"); err != nil {
		return nil, err
	}
	return m.lock(ctx, lockfsm.KindRead, false, opts)
}

// Lock blocks until the key is granted to this session for writing: no
// reader or writer holds it. It queues behind those that came first.
func (m *RWMutex) Lock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "RWMutex.Lock"); err != nil {
		return nil, err
	}
	return m.lock(ctx, lockfsm.KindWrite, true, opts)
}

// TryLock takes the key for writing if nobody holds or waits for it, and
// otherwise fails at once with a *LockedError.
func (m *RWMutex) TryLock(ctx context.Context, opts ...LockOption) (*Lock, error) {
	if err := nilContext(ctx, "RWMutex.TryLock"); err != nil {
		return nil, err
	}
	return m.lock(ctx, lockfsm.KindWrite, false, opts)
}

func (m *RWMutex) lock(ctx context.Context, kind lockfsm.Kind, wait bool, opts []LockOption) (*Lock, error) {
	if err := m.s.n.familyLevel("read/write locks"); err != nil {
		return nil, err
	}
	return m.s.acquire(ctx, m.key, wait, client.Spec{Kind: kind}, opts)
}
