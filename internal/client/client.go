// Package client is the client side of lockmesh's sessions: this peer's
// sessions (one replicated session per shard a Session used, each with
// its holder-side lease), their lock attempts and held locks, the grant
// waiters, and the keepalive loop that keeps the sessions alive.
//
// It does no network I/O: node gives it the calls that reach the cluster
// (Config.Apply, Config.ReadAttempt, Config.KeepAlive) and the clocks it
// reads, so the lease rules of docs/SAFETY.md (the holder's side) and the
// keepalive schedule are tested without a cluster, on a fake clock.
// Background work (closes, releases, withdrawals) runs through Config.Go,
// which node tracks so that Close waits for it.
package client

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"

	"github.com/lockmesh/lockmesh/internal/clock"
)

// Config is what node gives a Client. Every field is required except
// RoundClock and Log.
type Config struct {
	// Name is this peer's name, the owner of its sessions on the cluster.
	Name string
	// SessionTTL is the default TTL (Client.Default), and the longest
	// keepalive interval is a quarter of it.
	SessionTTL time.Duration
	// LeaseMargin is the least a holder gives its lease up before the
	// TTL runs out (see Margin).
	LeaseMargin time.Duration
	// CloseTimeout bounds the close of each session on the cluster when
	// the node closes (Client.Close).
	CloseTimeout time.Duration

	// Clock is the lease clock: it times keepalive sends, deadlines and
	// the deadline timers. It must not run slow (internal/clock; node's
	// is clock.Boot).
	Clock clock.Clock
	// RoundClock times the keepalive rounds; nil means Clock. node uses
	// the system clock, so that a jump of the lease clock moves
	// deadlines but not the rounds that keep them.
	RoundClock clock.Clock
	Log        *slog.Logger

	// Apply commits cmd in shard's Raft log and returns its result,
	// retrying unchanged while the outcome is unknown and ctx lasts.
	Apply func(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error)
	// ApplyGroup is Apply for the commands of an all-or-nothing group,
	// which share one entry in order.
	ApplyGroup func(ctx context.Context, shard uint64, cmds []lockfsm.Command) ([]lockfsm.Result, error)
	// ReadAttempt reads the attempt (session, req) from shard's
	// replicated state, linearizably; found is false when the shard no
	// longer knows the session.
	ReadAttempt func(ctx context.Context, shard, session, req uint64) (found bool, attempt lockfsm.RequestInfo, err error)
	// ReadKey, when not nil, reads key's holders and waiters from shard's
	// replicated state, linearizably; found is false when nobody holds or
	// waits for the key. A wait that gives up because its ctx ended reads
	// its key once with it, so that its error says whom it waited behind
	// (WaitError); nil leaves those details out.
	ReadKey func(ctx context.Context, shard uint64, key string) (info lockfsm.KeyInfo, found bool, err error)
	// KeepAlive delivers one keepalive for the sessions ids of this peer
	// to shard's leader, and returns those the leader counts as expired.
	KeepAlive func(ctx context.Context, shard uint64, ids []uint64) (expired []uint64, err error)
	// Go runs f in the background with a context that ends when the
	// node stops; node waits for it on Close.
	Go func(f func(ctx context.Context))
	// Stop is closed when the node stops (node passes its context's Done,
	// the context Go hands out).
	Stop <-chan struct{}
	// Level is the cluster's feature level as this peer knows it; nil
	// means level 1. From the level that labels sessions an OpenSession
	// carries its Session's label (lockfsm.Command.Label); before, the
	// replicated sessions go unlabelled: a peer of an older release would
	// halt on the field.
	Level func() level.Level

	// OnQueued, when not nil, is called with an acquire's context when
	// the attempt was queued behind other holders (node times the wait
	// and marks the trace with it). It must not block.
	OnQueued func(ctx context.Context)
	// OnLost, when not nil, is called once for each replicated session
	// lost (not closed), with the number of locks it held and the reason
	// (LossReason). It must not block.
	OnLost func(shard uint64, locks int, reason string)
}

// Client is the client side of one peer: its Sessions (node's Sessions),
// the default Session of each shard (node.Lock's), and their keepalives.
// Safe for concurrent use.
type Client struct {
	cfg     Config
	waiters *Waiters
	waits   Waits // the flagged ones, for the cross-shard deadlock check
	// lastRound is read and written by the keepalive loop alone.
	lastRound roundReadings
	kick      chan struct{} // a session opened: its TTL may be the shortest
	hooks     testHooks

	mu       sync.Mutex
	sessions map[*Session]struct{} // the live ones: keepalives and Close reach them here
	defaults map[uint64]*Session   // the default Session of each shard
	closed   bool                  // set by Close: no new Session
}

// Waits returns this peer's queued attempts that wait with
// lockfsm.FlagDeadlock, for the cross-shard deadlock check to read and
// refuse.
func (c *Client) Waits() *Waits { return &c.waits }

// New returns a Client with no sessions. It starts nothing: node runs
// RunKeepAlives.
func New(cfg Config) *Client {
	if cfg.RoundClock == nil {
		cfg.RoundClock = cfg.Clock
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Client{
		cfg: cfg, waiters: NewWaiters(), kick: make(chan struct{}, 1),
		sessions: map[*Session]struct{}{}, defaults: map[uint64]*Session{},
	}
}

// testHooks let this package's tests see, and hold up, the moments that
// races between one session's goroutines turn on; all nil outside tests.
// A test sets them before the Client's first Session.
type testHooks struct {
	// settling is called when an acquire of key is about to wait for its
	// session's own release or withdrawal of key to commit, or for an
	// ending hold of key to be given up.
	settling func(key string)
	// unlisted is called by a release as soon as its hold is no longer
	// listed as held, before the release is proposed.
	unlisted func(h *Held)
}

// Waiters returns the registry that grants for this peer's queued
// attempts are handed to.
func (c *Client) Waiters() *Waiters { return c.waiters }

func (c *Client) now() time.Time { return c.cfg.Clock.Now() }

// stopped reports whether the node has stopped.
func (c *Client) stopped() bool {
	select {
	case <-c.cfg.Stop:
		return true
	default:
		return false
	}
}

// NewSession starts an Session with ttl. It does no I/O: the Session opens a
// replicated session on each shard at its first lock there. It fails with
// lockerr.Closed once Close was called or the node stopped.
func (c *Client) NewSession(ttl time.Duration) (*Session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.newSessionLocked(ttl)
}

func (c *Client) newSessionLocked(ttl time.Duration) (*Session, error) {
	if c.closed || c.stopped() {
		return nil, lockerr.Closed
	}
	o := &Session{c: c, ttl: ttl, label: newLabel(), shards: map[uint64]*slot{}, done: make(chan struct{})}
	c.sessions[o] = struct{}{}
	return o, nil
}

// newLabel is a random Session label: never 0 (no label), and with 64
// random bits two Sessions of a cluster share one with odds of about n²/2⁶⁵.
func newLabel() uint64 {
	for {
		if l := rand.Uint64(); l != 0 {
			return l
		}
	}
}

// Default returns the live default Session of shard, with Config.SessionTTL,
// starting a new one if there is none or the last has ended: a loss on one
// shard does not end node.Lock's locks on another.
func (c *Client) Default(shard uint64) (*Session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if o := c.defaults[shard]; o != nil && o.Err() == nil {
		return o, nil
	}
	o, err := c.newSessionLocked(c.cfg.SessionTTL)
	if err == nil {
		o.shared = true
		c.defaults[shard] = o
	}
	return o, err
}

// forget drops an ended Session from the registry.
func (c *Client) forget(o *Session) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sessions, o)
	for shard, d := range c.defaults {
		if d == o {
			delete(c.defaults, shard)
		}
	}
}

// live lists the replicated sessions to keep alive: the opened, not lost
// sessions of every live, not orphaned Session.
func (c *Client) live() []*ShardSession {
	c.mu.Lock()
	owners := make([]*Session, 0, len(c.sessions))
	for o := range c.sessions {
		owners = append(owners, o)
	}
	c.mu.Unlock()
	var out []*ShardSession
	for _, o := range owners {
		o.mu.Lock()
		if o.err == nil && !o.orphaned {
			for _, s := range o.openedLocked() {
				if !s.isLost() {
					out = append(out, s)
				}
			}
		}
		o.mu.Unlock()
	}
	return out
}

// Close ends every Session of this peer with lockerr.Closed and closes their
// sessions on the cluster, each bounded by Config.CloseTimeout and ctx,
// so their locks pass to the next waiters at once; orphaned Sessions are
// left to their TTL. Holders here see Done closed before the cluster can
// hand their locks on. No Session starts after Close. It returns when every
// close has committed or given up.
func (c *Client) Close(ctx context.Context) {
	c.mu.Lock()
	c.closed = true
	owners := make([]*Session, 0, len(c.sessions))
	for o := range c.sessions {
		owners = append(owners, o)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, o := range owners {
		orphaned := o.Orphaned()
		for _, s := range o.end(fmt.Errorf("%w: the session ended with it; its locks pass to the next waiters", lockerr.Closed)) {
			if orphaned {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, c.cfg.CloseTimeout)
				defer cancel()
				_, _ = c.cfg.Apply(cctx, s.shard, lockfsm.Command{Op: lockfsm.OpCloseSession, Session: s.id})
			}()
		}
	}
	wg.Wait()
}

// Attempts is the request table of one replicated session: the request
// ids it hands out (increasing from 1), which of them still wait for their
// final answer, and the keys whose release, or whose withdrawal of an
// abandoned attempt, has not committed yet. The state machine may forget
// a finished attempt only once the client says it has the answers to
// every request below Ack. Safe for concurrent use.
type Attempts struct {
	mu      sync.Mutex
	next    uint64
	pending map[uint64]struct{}
	// releasing lists, per key, the releases and withdrawals in flight:
	// several at once when the session held the key several times over
	// (a semaphore's takes), or released it and withdrew another attempt.
	releasing map[string][]chan struct{}
	// waiting is testHooks.settling of the session's Client.
	waiting func(key string)
}

// NewAttempts returns an empty table whose first request id is 1.
func NewAttempts() *Attempts {
	return &Attempts{next: 1, pending: map[uint64]struct{}{}, releasing: map[string][]chan struct{}{}}
}

// Begin allocates the next request id; it is pending until Finish.
func (t *Attempts) Begin() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.next
	t.next++
	t.pending[r] = struct{}{}
	return r
}

// BeginN allocates n consecutive request ids, the first returned; each
// is pending until Finish. An all-or-nothing group needs them consecutive.
func (t *Attempts) BeginN(n int) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := t.next
	for range n {
		t.pending[t.next] = struct{}{}
		t.next++
	}
	return first
}

// Finish records that the final answer to request r is in.
func (t *Attempts) Finish(r uint64) {
	t.mu.Lock()
	delete(t.pending, r)
	t.mu.Unlock()
}

// Ack is the lowest request id whose answer is still outstanding, or the
// next id if none is: every request below it has its answer.
func (t *Attempts) Ack() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.next
	for r := range t.pending {
		a = min(a, r)
	}
	return a
}

// StartRelease records that a release of key, or the withdrawal of an
// abandoned attempt on it, is in flight until EndRelease with the
// returned channel. Each is waited for on its own: one ending does not
// end another of the same key.
func (t *Attempts) StartRelease(key string) chan struct{} {
	done := make(chan struct{})
	t.mu.Lock()
	t.releasing[key] = append(t.releasing[key], done)
	t.mu.Unlock()
	return done
}

// EndRelease records that the release or withdrawal StartRelease
// returned done for has its answer, and wakes those waiting for it.
func (t *Attempts) EndRelease(key string, done chan struct{}) {
	t.mu.Lock()
	if rs := slices.DeleteFunc(t.releasing[key], func(c chan struct{}) bool { return c == done }); len(rs) == 0 {
		delete(t.releasing, key)
	} else {
		t.releasing[key] = rs
	}
	t.mu.Unlock()
	close(done)
}

// AwaitRelease waits until every release and withdrawal of key in flight
// when it was called has its answer, or until abort closes (then it
// returns nil: the caller starts over) or ctx ends.
func (t *Attempts) AwaitRelease(ctx context.Context, key string, abort <-chan struct{}) error {
	t.mu.Lock()
	inFlight := slices.Clone(t.releasing[key])
	t.mu.Unlock()
	if len(inFlight) == 0 {
		return nil
	}
	if t.waiting != nil {
		t.waiting(key)
	}
	for _, done := range inFlight {
		select {
		case <-done:
		case <-abort:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// WaiterKey names one queued lock attempt.
type WaiterKey struct{ Shard, Session, Req uint64 }

// Verify is the value a waiter receives for a grant notice: a hint, to be
// checked against the replicated state, never a token (tokens start at 1).
const Verify uint64 = 0

// Waiters are the queued lock attempts of a peer, each with the channel
// its grant arrives on. A queued attempt learns of its grant one way: a
// value on its channel, either the token (from this peer's own replica,
// which applied the hand-off) or Verify (a notice pushed by the leader,
// which the waiter checks with a read). Safe for concurrent use.
type Waiters struct {
	mu sync.Mutex
	m  map[WaiterKey]chan uint64
}

// NewWaiters returns an empty registry.
func NewWaiters() *Waiters { return &Waiters{m: map[WaiterKey]chan uint64{}} }

// Add registers the attempt k and returns the channel its grant arrives on.
func (w *Waiters) Add(k WaiterKey) <-chan uint64 {
	ch := make(chan uint64, 1)
	w.mu.Lock()
	w.m[k] = ch
	w.mu.Unlock()
	return ch
}

// Remove forgets the attempt k; later wakes for it are dropped.
func (w *Waiters) Remove(k WaiterKey) {
	w.mu.Lock()
	delete(w.m, k)
	w.mu.Unlock()
}

// Wake hands token (or Verify) to the waiter k, if it still waits. A token
// replaces a pending Verify; Verify never replaces anything.
func (w *Waiters) Wake(k WaiterKey, token uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := w.m[k]
	if ch == nil {
		return
	}
	select {
	case ch <- token:
		return
	default:
	}
	if token == Verify {
		return
	}
	// Full: it holds a Verify (or this same token). Swap it for the
	// token; wakes are sent under mu, so nothing refills it meanwhile.
	select {
	case <-ch:
	default:
	}
	ch <- token
}

// Keys lists the attempts waiting, in no particular order.
func (w *Waiters) Keys() []WaiterKey {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]WaiterKey, 0, len(w.m))
	for k := range w.m {
		out = append(out, k)
	}
	return out
}

// level is the cluster's feature level as this peer knows it (Config.Level).
func (c *Client) level() level.Level {
	if c.cfg.Level == nil {
		return level.Positional
	}
	return c.cfg.Level()
}
