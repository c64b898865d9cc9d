package peer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/msgcheck"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Watches (feature level 4). A watch asks a host of its key's shard for
// what came after the last entry it saw (WatchRequest.After): the host
// answers from its replica's journal (replica.Journal) the batches of
// events on the watched keys after After, waiting up to WaitMillis for
// one, or that the journal no longer reaches back to After (Gone). Asked
// for a Snapshot it answers at once with the keys' state as a
// linearizable read of its replica found it, and the index it is at. Only a snapshot may
// take a whole frame: a waiting request holds the room of a
// LargeAnswer in its connection's budget (AnswerBound), so that watches
// waiting on a connection never hold up the lock requests and keepalives
// that share it. A peer has at most maxRemoteWatches requests waiting
// on other peers, and maxRemoteSnapshots snapshot requests (which may
// take a frame each), and bounds each by its wait and the proposal
// timeout, so a host that never answers holds no slot for ever. Every replica applies the same entries, so any host
// continues where another left off: the watcher resumes from the last
// index it delivered, across leader changes and restarts, without a gap
// or a repeat.

// WatchRequest asks a host of Shard for the events of Key (or, with
// Prefix, of its keys) after index After.
type WatchRequest struct {
	Shard  uint64 `msgpack:"s"`
	Key    string `msgpack:"y"`
	Prefix bool   `msgpack:"p,omitempty"`
	// After is the last index the watcher saw.
	After uint64 `msgpack:"a,omitempty"`
	// Snapshot asks for the keys' state now, answered at once, instead
	// of what came after After.
	Snapshot bool `msgpack:"n,omitempty"`
	// WaitMillis is how long the host may wait for an event, at most
	// MaxWatchWait.
	WaitMillis uint32      `msgpack:"w,omitempty"`
	Level      level.Level `msgpack:"v"`
}

// WatchAnswer is a host's answer to a WatchRequest: a snapshot of the
// keys, the batches of events after After (none when nothing happened
// to the keys while the host waited: a bookmark), or Gone.
type WatchAnswer struct {
	// Snapshot is set when Keys is the keys' state at Index (After was 0).
	Snapshot bool `msgpack:"sn,omitempty"`
	// Gone is set when the journal no longer holds the entries after
	// After: the watcher asks for a snapshot.
	Gone bool `msgpack:"g,omitempty"`
	// Keys are the watched keys held or waited for; KeysMore is true when
	// there were more than replica.MaxWatchKeys of them.
	Keys     []lockfsm.KeyInfo `msgpack:"ks,omitempty"`
	KeysMore bool              `msgpack:"km,omitempty"`
	// Index is the snapshot's index, or the last index the answer covers:
	// nothing happened to the keys between the last batch and it.
	Index   uint64          `msgpack:"ix"`
	Batches []replica.Batch `msgpack:"b,omitempty"`
}

// Bounds of a watch's answers.
const (
	// MaxWatchWait is the longest a host waits for an event before it
	// answers with none.
	MaxWatchWait = 5 * time.Second
	// maxWatchBatches is about the most bytes of events an answer
	// carries (replica.EventSize): an entry's events are never split, so
	// one entry with more comes whole, and waits for room in its
	// connection's budget like any answer over its bound.
	maxWatchBatches = LargeAnswer - 1<<10
)

// maxRemoteWatches bounds the watch requests this peer has in flight to
// other peers at once: each holds a LargeAnswer's room in its
// connection's budget (transport.Config.MaxPendingBytes, 8 MiB) while
// its host waits, so at most a quarter of a connection's budget waits on
// watches, and the lock requests and keepalives sharing it never wait
// behind them. Watches past it wait their turn.
const (
	maxRemoteWatches   = 32
	maxRemoteSnapshots = 2
)

// journals holds the journal of each lock replica this peer runs, and
// the slots of its remote watch requests.
type journals struct {
	m         sync.Map // shard -> *replica.Journal
	slots     chan struct{}
	snapshots chan struct{}
}

// start makes the journal of a new replica of shard, replacing any
// earlier one's.
func (js *journals) start(shard uint64, limit int) *replica.Journal {
	j := replica.NewJournal(limit)
	js.m.Store(shard, j)
	return j
}

func (js *journals) of(shard uint64) *replica.Journal {
	if j, ok := js.m.Load(shard); ok {
		return j.(*replica.Journal)
	}
	return nil
}

// Watch answers req from a host of its shard: this peer's replica when it
// runs one, else another host's over RPC.
func (n *Peer) Watch(ctx context.Context, req WatchRequest) (WatchAnswer, error) {
	if n.HostsShard(req.Shard) {
		return n.ServeWatch(ctx, req)
	}
	req.Level = n.TopLevel()
	body, err := EncodeBody(req)
	if err != nil {
		return WatchAnswer{}, err
	}
	slots := n.journals.slots
	if req.Snapshot {
		slots = n.journals.snapshots
	}
	select {
	case slots <- struct{}{}:
		defer func() { <-slots }()
	case <-ctx.Done():
		return WatchAnswer{}, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, min(time.Duration(req.WaitMillis)*time.Millisecond, MaxWatchWait)+n.proposalTimeout())
	defer cancel()
	resp, err := n.router.CallHost(ctx, req.Shard, MethodWatch, body)
	if err != nil {
		return WatchAnswer{}, err
	}
	var a WatchAnswer
	if err := msgcheck.Unmarshal(resp, &a, msgcheck.MaxBody); err != nil {
		return WatchAnswer{}, fmt.Errorf("rpc body: %w", err)
	}
	return a, nil
}

// ServeWatch answers req through this peer's replica of its shard.
func (n *Peer) ServeWatch(ctx context.Context, req WatchRequest) (WatchAnswer, error) {
	if n.IsClosed() {
		return WatchAnswer{}, RPCError(codeClosed, "peer %s is closing", n.cfg.Name)
	}
	j := n.journals.of(req.Shard)
	if j == nil || !n.HostsShard(req.Shard) {
		return WatchAnswer{}, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no replica of shard %d", n.cfg.Name, req.Shard)
	}
	if err := lockfsm.ValidateKey(req.Key); err != nil {
		return WatchAnswer{}, fmt.Errorf("watch: %w", err)
	}
	if !req.Snapshot {
		match := replica.Match(req.Key, req.Prefix)
		wait := min(time.Duration(req.WaitMillis)*time.Millisecond, MaxWatchWait)
		wctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		for {
			batches, upTo, gone := j.Since(req.After, match, maxWatchBatches)
			if gone {
				return WatchAnswer{Gone: true, Index: upTo}, nil
			}
			if len(batches) > 0 || j.Wait(wctx, upTo) != nil || n.IsClosed() {
				if n.hooks.UnsafeWatchSkipHandOffs {
					batches = skipHandOffs(batches)
				}
				return WatchAnswer{Index: upTo, Batches: batches}, nil
			}
		}
	}
	a, err := n.ReadLocal(ctx, req.Shard, replica.Query{Kind: replica.QueryWatch, Key: req.Key, Prefix: req.Prefix})
	if err != nil {
		return WatchAnswer{}, err
	}
	return WatchAnswer{Snapshot: true, Keys: a.Keys, KeysMore: a.KeysMore, Index: a.Index}, nil
}

// Backoff waits before a retry, as the router's own retries do: longer
// with each attempt, jittered, until ctx ends.
func (n *Peer) Backoff(ctx context.Context, attempt int) error { return n.router.Backoff(ctx, attempt) }

// skipHandOffs leaves out the grants of batches that hand a key on (a
// release of it came before, in the same entry): Hooks.UnsafeWatchSkipHandOffs.
func skipHandOffs(batches []replica.Batch) []replica.Batch {
	out := make([]replica.Batch, 0, len(batches))
	for _, b := range batches {
		released := map[string]bool{}
		var kept []lockfsm.Event
		for _, e := range b.Events {
			switch {
			case e.Kind == lockfsm.EventReleased || e.Kind == lockfsm.EventExpired:
				released[e.Key] = true
			case e.Kind == lockfsm.EventGranted && released[e.Key]:
				continue
			}
			kept = append(kept, e)
		}
		out = append(out, replica.Batch{Index: b.Index, Events: kept})
	}
	return out
}
