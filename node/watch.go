package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Watches: every change to a key's holders, waiters and values, in the
// order the Raft log made them, from any peer. A watch starts from a
// linearizable snapshot of the key (or of the keys of a prefix within one
// hash tag), then delivers the events of each Raft entry that touched
// them, all of one entry in one WatchResponse. It resumes from the last
// index it delivered on whichever replica of the shard answers, across
// shard leader changes, moves and peer restarts, so nothing is missed,
// repeated or reordered; when the replicas no longer hold the entries
// after that index (they keep replica.JournalEvents events each; a
// snapshot was installed), it says so with a Resync carrying the state
// at a later index, never a silent gap. docs/WATCH.md compares it with
// etcd's watches, ZooKeeper's and Consul's blocking queries.

// ErrSlowWatcher is the cause a watch gives when its consumer fell so far
// behind that the events it missed are gone: it gets a Resync, not an
// error, unless WithNoResync asked for the error.
var ErrSlowWatcher = errors.New("lockmesh: watcher fell behind")

// WatchEventKind is what happened to a holder or waiter.
type WatchEventKind uint8

// The kinds of watch events.
const (
	// Granted: the attempt became a holder, at once or by hand-off.
	Granted WatchEventKind = WatchEventKind(lockfsm.EventGranted)
	// Released: a holder gave the key up (Unlock, Release, its Session
	// closed).
	Released WatchEventKind = WatchEventKind(lockfsm.EventReleased)
	// Expired: the cluster took the key back: the holder's session
	// expired, or its maximum hold ran out.
	Expired WatchEventKind = WatchEventKind(lockfsm.EventExpired)
	// Queued: the attempt joined the key's queue.
	Queued WatchEventKind = WatchEventKind(lockfsm.EventQueued)
	// Cancelled: a waiter left the queue without a grant.
	Cancelled WatchEventKind = WatchEventKind(lockfsm.EventCancelled)
	// ValueChanged: a holder replaced its value (Lock.SetValue,
	// Leadership.Proclaim).
	ValueChanged WatchEventKind = WatchEventKind(lockfsm.EventValue)
)

// String returns the kind's name.
func (k WatchEventKind) String() string { return lockfsm.EventKind(k).String() }

// WatchEvent is one change to a key.
type WatchEvent struct {
	Kind WatchEventKind
	Key  string
	// Holder is the holder or waiter it happened to: its Token is the
	// grant's (0 for a waiter's events), its Value the one after the
	// event. Age is not set.
	Holder Holder
	// Position is a Queued waiter's place in the key's queue (0 is its
	// head): the tail, unless it waits with a priority (WithPriority).
	Position int
}

// WatchResponse is what a watch delivers: a snapshot of the watched keys
// (the first response, and every Resync), the events of one Raft entry,
// or a bookmark that says nothing happened to the keys up to Index.
type WatchResponse struct {
	// Index is the Raft index of the entry the events are of, of the
	// state a snapshot shows, or a bookmark's. Indexes only rise: resume
	// a watch after the last one delivered (WithStartIndex).
	Index uint64
	// Snapshot is set when Keys is the state of the watched keys at
	// Index: the watch's start, or, with Resync, its restart after the
	// entries since the last response were no longer held.
	Snapshot, Resync bool
	// Keys are the watched keys held or waited for (Snapshot).
	Keys []KeyInfo
	// Events are every event of the entry at Index on the watched keys,
	// in the order the entry made them: a release before the grant it
	// hands the key on to.
	Events []WatchEvent
	// Bookmark is set when nothing happened to the watched keys up to
	// Index.
	Bookmark bool
	// Err, on the last response before the channel closes, says why the
	// watch ended; the channel also closes without one when ctx ends.
	Err error
}

// WatchOption configures Watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	prefix   bool
	start    uint64
	noResync bool
	buffer   int
}

// WithPrefix watches every key that starts with key, which must hold a
// whole hash tag ("{order-42}/"), so all of them live on one shard. A
// prefix without one is ErrInvalidArgument: it would span shards.
func WithPrefix() WatchOption { return func(o *watchOptions) { o.prefix = true } }

// WithStartIndex resumes a watch after index i, the Index of the last
// response a previous watch delivered: the first response is the first
// entry after it that touched the keys, or a Resync if the replicas no
// longer hold the entries after i.
func WithStartIndex(i uint64) WatchOption { return func(o *watchOptions) { o.start = i } }

// WithNoResync ends the watch with ErrSlowWatcher where it would
// otherwise deliver a Resync.
func WithNoResync() WatchOption { return func(o *watchOptions) { o.noResync = true } }

// WithWatchBuffer sets how many responses the watch channel buffers (16
// by default). A consumer that stops reading holds up at most that many
// responses and one host's answer (about 63 KiB of events); the watch
// stops asking meanwhile, and resumes, or resyncs, when it reads again.
func WithWatchBuffer(n int) WatchOption { return func(o *watchOptions) { o.buffer = n } }

// watchBookmarkEvery is how often an idle watch delivers a bookmark.
const watchBookmarkEvery = time.Second

// Watch watches key, or with WithPrefix the keys that start with it, and
// delivers what happens to them on the returned channel until ctx ends or
// the watch fails (its last response's Err says why), then closes it.
// Errors from the cluster that pass (no leader yet, a replica moved, a
// peer restarting) are retried, resuming after the last index delivered.
// Needs feature level 4.
func (n *Node) Watch(ctx context.Context, key string, opts ...WatchOption) (<-chan WatchResponse, error) {
	if err := nilContext(ctx, "Node.Watch"); err != nil {
		return nil, err
	}
	o := watchOptions{buffer: 16}
	for _, opt := range opts {
		opt(&o)
	}
	if err := lockfsm.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("%w: watch: %v", ErrInvalidKey, err)
	}
	if o.buffer < 0 {
		return nil, fmt.Errorf("%w: WithWatchBuffer(%d)", ErrInvalidArgument, o.buffer)
	}
	if n.peer.IsClosed() {
		return nil, ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
	if err != nil {
		return nil, err
	}
	if err := n.needLevel(level.Coordination, "watches"); err != nil {
		return nil, err
	}
	shard := p.ShardOf(key)
	if o.prefix {
		var ok bool
		if shard, ok = p.PrefixShard(key); !ok {
			return nil, fmt.Errorf("%w: watch of prefix %q: a prefix must hold a whole hash tag, as \"{tag}/\", so that its keys live on one shard", ErrInvalidArgument, key)
		}
	}
	w := &watch{n: n, req: peer.WatchRequest{Shard: shard, Key: key, Prefix: o.prefix, After: o.start, Snapshot: o.start == 0}, o: o,
		out: make(chan WatchResponse, o.buffer)}
	go w.run(ctx)
	return w.out, nil
}

// watch is one Watch's pump: it asks hosts for what followed the last
// index it delivered, and delivers it, one answer at a time.
type watch struct {
	n   *Node
	req peer.WatchRequest // its After is the last index delivered
	o   watchOptions
	out chan WatchResponse
	// resync is set once a host said the entries after the last index
	// delivered are gone: the snapshot asked for then is a Resync.
	resync bool
}

func (w *watch) run(ctx context.Context) {
	defer close(w.out)
	lastSent := time.Now()
	for attempt := 0; ctx.Err() == nil; {
		if w.n.peer.IsClosed() {
			w.send(ctx, WatchResponse{Index: w.req.After, Err: ErrClosed})
			return
		}
		w.req.WaitMillis = uint32(watchBookmarkEvery / time.Millisecond)
		a, err := w.n.peer.Watch(ctx, w.req)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !router.Retryable(err) && !errors.Is(err, lockerr.Unavailable) {
				w.send(ctx, WatchResponse{Index: w.req.After, Err: fmt.Errorf("watch %q: %w", w.req.Key, err)})
				return
			}
			// Resumed from the last index delivered, on whichever host
			// answers next.
			_ = w.n.peer.Backoff(ctx, min(attempt, 3))
			attempt++
			continue
		}
		attempt = 0
		switch {
		case a.Gone:
			if w.o.noResync {
				w.send(ctx, WatchResponse{Index: w.req.After, Err: fmt.Errorf("watch %q: %w: the entries after index %d are no longer held", w.req.Key, ErrSlowWatcher, w.req.After)})
				return
			}
			w.resync, w.req.Snapshot = true, true // a snapshot, next
		case a.Snapshot:
			if a.KeysMore {
				w.send(ctx, WatchResponse{Index: w.req.After, Err: fmt.Errorf("%w: watch of prefix %q: more than %d keys are held or waited for", ErrInvalidArgument, w.req.Key, replica.MaxWatchKeys)})
				return
			}
			keys := make([]KeyInfo, len(a.Keys))
			for i, k := range a.Keys {
				keys[i] = KeyInfo{Key: k.Key, Shard: w.req.Shard, Holders: holders(k.Holders), Waiters: holders(k.Waiters)}
			}
			if !w.send(ctx, WatchResponse{Index: a.Index, Snapshot: true, Resync: w.resync, Keys: keys}) {
				return
			}
			w.req.After, w.req.Snapshot, w.resync, lastSent = a.Index, false, false, time.Now()
		case len(a.Batches) > 0:
			for _, b := range a.Batches {
				if b.Index <= w.req.After {
					continue // a host never answers these; a guard
				}
				if !w.send(ctx, WatchResponse{Index: b.Index, Events: watchEvents(b.Events)}) {
					return
				}
				w.req.After = b.Index
			}
			w.req.After, lastSent = max(w.req.After, a.Index), time.Now()
		case a.Index > w.req.After:
			w.req.After = a.Index
			if time.Since(lastSent) >= watchBookmarkEvery {
				if !w.send(ctx, WatchResponse{Index: a.Index, Bookmark: true}) {
					return
				}
				lastSent = time.Now()
			}
		}
	}
}

// send delivers r, or reports false when ctx ended first.
func (w *watch) send(ctx context.Context, r WatchResponse) bool {
	select {
	case w.out <- r:
		return true
	case <-ctx.Done():
		return false
	}
}

func watchEvents(es []lockfsm.Event) []WatchEvent {
	out := make([]WatchEvent, len(es))
	for i, e := range es {
		h := Holder{Peer: e.Owner, Session: e.Label, ShardSession: e.Session, Request: e.Req, Token: e.Token,
			Kind: e.Lock.String(), Permits: int(max(e.Permits, 1))}
		h.Value = slices.Clone(e.Value) // a local journal's events share the state's bytes
		out[i] = WatchEvent{Kind: WatchEventKind(e.Kind), Key: e.Key, Holder: h, Position: e.Position}
	}
	return out
}
