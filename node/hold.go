package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Holding a lock well: a context that ends with the hold, a function run
// under a lock, and a sync.Locker.

// Context returns a context derived from parent that is cancelled when
// this hold ends: when Done closes (the lease may have expired, the
// session was closed or lost, or the node closed) or when this Lock is
// unlocked or released. context.Cause says which: ErrReleased after
// Unlock or Release, else the error Err returns (wrapping
// ErrLeaseExpired, ErrSessionClosed or ErrClosed), or parent's cause.
//
// It is cancelled when Done closes, so before the cluster can grant the
// key to anybody else, and a holder that passes it to its work stops
// that work in time. Like Done, it learns of a lease that ran out while
// the machine was suspended when Done's timer fires or Done or Err is
// next called; call Err before an irreversible step. Each call keeps a
// small record until the hold ends.
func (l *Lock) Context(parent context.Context) context.Context {
	ctx, cancel := context.WithCancelCause(parent)
	l.mu.Lock()
	given := l.given.Load()
	if !given {
		l.onGive = append(l.onGive, func() { cancel(ErrReleased) })
	}
	l.mu.Unlock()
	if given {
		cancel(ErrReleased)
		return ctx
	}
	l.h.AfterDone(func() { cancel(l.endCause()) })
	return ctx
}

// endCause is why this hold ended once its grant's Done closed.
func (l *Lock) endCause() error {
	err := l.h.Err()
	if err == nil || errors.Is(err, ErrNotHeld) {
		return ErrReleased
	}
	return err
}

// A Locker takes locks by key: *Node (in its default sessions) and
// *Session are Lockers.
type Locker interface {
	Lock(ctx context.Context, key string, opts ...LockOption) (*Lock, error)
}

// unlockBound is how long WithLock and a sync.Locker wait for a release
// to commit; one that has not committed by then goes on in the
// background (see Lock.Unlock).
const unlockBound = 10 * time.Second

// WithLock takes key through locker, runs fn with the lock's Context (see
// Lock.Context) and unlocks the key when fn returns or panics: on a
// context of its own, bounded by 10 s, since ctx is often cancelled by
// then. A panic of fn goes on after the unlock.
//
// It returns fn's error, or the error that kept the lock from being
// taken. When the hold ended while fn ran (lease lost, session closed,
// node closed), fn may have been cut short, and the error says so: it
// wraps both that end (errors.Is(err, ErrLeaseExpired), for a lost lease)
// and fn's error. An unlock that fails after fn succeeded is returned
// too: the lock may have ended before fn did.
func WithLock(ctx context.Context, locker Locker, key string, fn func(ctx context.Context) error, opts ...LockOption) (err error) {
	l, err := locker.Lock(ctx, key, opts...)
	if err != nil {
		return err
	}
	defer func() {
		ended := l.Err() // before the unlock: nil while still held
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockBound)
		uerr := l.Unlock(uctx)
		cancel()
		switch {
		case ended != nil && err != nil:
			err = fmt.Errorf("lock %q ended while the function ran: %w; the function returned: %w", key, ended, err)
		case ended != nil:
			err = fmt.Errorf("lock %q ended while the function ran: %w", key, ended)
		case err == nil:
			err = uerr
		}
	}()
	return fn(l.Context(ctx))
}

// NewSyncLocker returns a sync.Locker of key, for code written against
// sync.Locker (as etcd's concurrency.NewLocker). Lock waits, without a
// bound, until key is granted through locker; Unlock releases it without
// waiting for the cluster (Lock.Release: mutual exclusion is kept until
// the release commits).
//
// A sync.Locker cannot return errors, so it panics where the ctx API
// returns one: Lock when the lock cannot be taken (the node or session
// closed, or the session holds key already), Unlock when the lock is not
// held (as sync.Mutex does) or when its lease was lost while held, since
// the critical section that just ended may have run without the lock.
// Prefer Lock and Lock.Context where a lost lease must be handled.
func NewSyncLocker(locker Locker, key string) sync.Locker {
	return &syncLocker{locker: locker, key: key}
}

type syncLocker struct {
	locker Locker
	key    string
	mu     sync.Mutex
	held   []*Lock // the holds taken, oldest first: each Unlock gives one up
}

func (s *syncLocker) Lock() {
	l, err := s.locker.Lock(context.Background(), s.key)
	if err != nil {
		panic(fmt.Sprintf("lockmesh: sync.Locker of %q: Lock: %v", s.key, err))
	}
	s.mu.Lock()
	s.held = append(s.held, l)
	s.mu.Unlock()
}

func (s *syncLocker) Unlock() {
	s.mu.Lock()
	if len(s.held) == 0 {
		s.mu.Unlock()
		panic(fmt.Sprintf("lockmesh: sync.Locker of %q: Unlock of an unlocked lock", s.key))
	}
	l := s.held[0]
	s.held = s.held[1:]
	s.mu.Unlock()
	if err := l.Release(); err != nil {
		panic(fmt.Sprintf("lockmesh: sync.Locker of %q: Unlock: %v", s.key, err))
	}
}
