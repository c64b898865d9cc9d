package node

import (
	"fmt"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// The options of every lock call (LockOption: WithMaxHold) and the
// feature level the lock family needs. The family beyond the mutex —
// read/write locks (rwmutex.go), counting semaphores (semaphore.go) and
// locks over several keys (multilock.go) — is held through a Session with
// the mutex's guarantees (FIFO queues in the replicated state, the grant
// in the Raft entry that frees the key, a fencing token per grant, Done
// and Err per held lock). It needs the cluster at feature level 3: until
// every peer runs a release that speaks it, it fails with ErrIncompatible
// and mutexes go on. docs/LOCKS.md says what was chosen where the usual
// libraries differ.

// familyLevel refuses the lock family below feature level 3: a replica
// of an older release would halt on its commands.
func (n *Node) familyLevel(what string) error {
	return n.needLevel(level.Family, what)
}

// needLevel refuses what the cluster's feature level does not have yet:
// a replica of an older release would halt on its commands.
func (n *Node) needLevel(l level.Level, what string) error {
	if cur := n.peer.ClusterLevel(); cur < l {
		return fmt.Errorf("%w: %s need feature level %d; the cluster runs at %d until every peer is upgraded (see docs/UPGRADING.md)",
			ErrIncompatible, what, l, cur)
	}
	return nil
}

// LockOption configures one lock call (Lock, TryLock, RLock, Acquire and
// their Try forms).
type LockOption func(*lockOptions)

type lockOptions struct {
	maxHold  time.Duration
	value    []byte
	valued   bool
	priority uint8
}

// WithPriority queues the call's wait ahead of waiters of lower priority
// (0, the default, is the lowest), FIFO among equals: a candidate that
// should lead when it can (Campaign), a job that should not wait behind a
// batch. It never passes a waiter whose wait is deadlock-checked (every
// Session's lock but a prioritized one) or a LockAll group, and its own
// wait is not deadlock-checked. A waiter already queued keeps its place
// ahead of later ones of equal priority. Needs feature level 4.
func WithPriority(p uint8) LockOption {
	return func(o *lockOptions) { o.priority = p }
}

// MaxValueLen is the longest value, in bytes, a hold carries (WithValue,
// Lock.SetValue, Campaign, Leadership.Proclaim).
const MaxValueLen = lockfsm.MaxValueLen

// WithValue attaches v to the hold the call makes, for as long as it
// holds or waits: Inspect and Watch show it with the holder (or waiter),
// and Lock.SetValue replaces it. Say who holds the key and for what (a
// host and port, a job id), at most MaxValueLen bytes; a longer one fails
// the call with ErrInvalidArgument. A reentrant re-lock keeps the first
// lock's value. Needs feature level 4.
func WithValue(v []byte) LockOption {
	return func(o *lockOptions) { o.value, o.valued = slices.Clone(v), true }
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
	if o.valued {
		if err := checkValue("WithValue", o.value); err != nil {
			return spec, err
		}
		if len(o.value) > 0 {
			if err := n.needLevel(level.Coordination, "values on holds"); err != nil {
				return spec, err
			}
			spec.Value = o.value
		}
	}
	if o.priority != 0 {
		if err := n.needLevel(level.Coordination, "priorities"); err != nil {
			return spec, err
		}
		spec.Priority = o.priority
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

// checkValue refuses a value longer than MaxValueLen, naming its size.
func checkValue(what string, v []byte) error {
	if len(v) > MaxValueLen {
		return fmt.Errorf("%w: %s of %d bytes: a value is at most MaxValueLen (%d) bytes", ErrInvalidArgument, what, len(v), MaxValueLen)
	}
	return nil
}
