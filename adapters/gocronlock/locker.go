package gocronlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/lockmesh/lockmesh/node"
)

// TryLocker takes a key if it is free and fails at once if not: *node.Node
// (in its default sessions) and *node.Session are TryLockers. (node.Locker
// only waits, and a gocron Locker must not wait.)
type TryLocker interface {
	TryLock(ctx context.Context, key string, opts ...node.LockOption) (*node.Lock, error)
}

// ErrJobLocked wraps a refused Lock: the job's lock is held, by another
// instance or by a run of the job still going on here, so gocron skips
// this run. The error wraps the node's error too: errors.Is(err,
// node.ErrLocked) and errors.As(err, **node.LockedError) give who held it.
var ErrJobLocked = errors.New("gocronlock: the job is running elsewhere")

// unlockBound is how long a job's Unlock waits for its release to commit;
// one that has not committed by then goes on in the background.
const unlockBound = 10 * time.Second

// Locker is a gocron.Locker that takes each job's key through a
// TryLocker. Make one with NewLocker; it is safe for concurrent use.
type Locker struct {
	tl     TryLocker
	prefix string
	opts   []node.LockOption
}

var _ gocron.Locker = (*Locker)(nil)

// LockerOption configures NewLocker.
type LockerOption func(*Locker)

// WithKeyPrefix puts prefix before every job's name to make its key, so
// that jobs' keys do not collide with the application's other lockmesh
// keys (a key and an election of the same name are the same key too):
// WithKeyPrefix("cron/") locks "cron/report" for the job named "report".
// It may carry a hash tag ("{cron}/") to keep every job in one shard.
func WithKeyPrefix(prefix string) LockerOption {
	return func(l *Locker) { l.prefix = prefix }
}

// WithLockOptions passes opts to every TryLock: node.WithMaxHold bounds
// how long a stuck job keeps its key, node.WithValue says who holds it.
func WithLockOptions(opts ...node.LockOption) LockerOption {
	return func(l *Locker) { l.opts = append(l.opts, opts...) }
}

// NewLocker returns a gocron.Locker that locks a job's name (after the
// prefix of WithKeyPrefix) through tl, for gocron.WithDistributedLocker
// or gocron.WithDistributedJobLocker.
//
// gocron calls Lock before each run with the job's name, which defaults
// to its function's name: give jobs names of their own (gocron.WithName)
// that every instance shares. Lock tries the key once: when it is held,
// by another instance or by a run of the job still going here, it fails
// with an error wrapping ErrJobLocked and the node's *node.LockedError,
// and gocron skips this run (and passes the error to the job's
// AfterLockError listener). Other errors (an invalid key, the node or
// session closed, the shard unavailable) come back as the node returned
// them, and gocron skips the run too. The lock is held until the run
// ends, when gocron unlocks it.
//
// The lock's lease belongs to tl's session. gocron cannot stop a job whose
// lease is lost while it runs, nor give the job the lock's fencing token:
// for a job that must be fenced, use an Elector, or take a lock inside
// the job (node.WithLock) and pass its token on.
func NewLocker(tl TryLocker, opts ...LockerOption) *Locker {
	l := &Locker{tl: tl}
	for _, opt := range opts {
		opt(l)
	}
	return l
}

// Lock tries the lock of the job called key once; see NewLocker.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	k := l.prefix + key
	lk, err := l.tl.TryLock(ctx, k, l.opts...)
	switch {
	case err == nil:
		return jobLock{lk}, nil
	case errors.Is(err, node.ErrLocked):
		return nil, fmt.Errorf("%w: %w", ErrJobLocked, err)
	case errors.Is(err, node.ErrAlreadyHeld):
		// A Session holds the key already: a run of the job goes on here.
		return nil, fmt.Errorf("%w: a run of %q still holds its lock on this session: %w", ErrJobLocked, k, err)
	default:
		return nil, err
	}
}

// jobLock is a job's lock while it runs.
type jobLock struct{ l *node.Lock }

// Unlock releases the job's lock and waits, at most 10 s, for the release
// to commit. gocron passes the job's context, which is cancelled when the
// job is removed or the scheduler shuts down, so the wait is not bound to
// it. It returns an error wrapping node.ErrLeaseExpired when the lease was
// lost while the job ran (gocron drops it).
func (j jobLock) Unlock(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockBound)
	defer cancel()
	return j.l.Unlock(ctx)
}
