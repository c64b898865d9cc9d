package node

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The watch checker: while a nemesis run's load locks its keys, a watcher
// per key follows them through whichever peer is up, resuming after the
// last index it delivered whenever its peer is killed or cut off. Per key
// it checks what a watch promises:
//
//   - ordered and unique: every response's index is above the last one's;
//   - no gap: each event fits the key as the responses so far describe it
//     (a release or value change names a holder, a cancel a waiter, a
//     grant a new holder with a token above every earlier grant's, at most
//     one holder of a mutex);
//   - complete: every grant a worker of the load got is among the grants
//     the watcher saw, unless a Resync (which the watcher reports) came
//     after it.
//
// Its broken variant, peer.Hooks.UnsafeWatchSkipHandOffs (hosts leave out
// the grants that hand a key on), must be caught
// (TestFamilyBrokenVariantsAreCaught/election-watch).

type watchCheck struct {
	key    string
	report func(format string, args ...any) // the run's, as soon as found

	mu         sync.Mutex
	last       uint64
	holders    []Holder
	waiters    []Holder
	top        uint64          // the highest token granted so far
	granted    map[uint64]bool // tokens seen granted
	excused    uint64          // grants up to this token may be missed: a Resync came after them
	resyncs    int
	responses  int
	restarts   int
	violations []string
}

func (w *watchCheck) violate(format string, args ...any) {
	v := fmt.Sprintf("watch %s: ", w.key) + fmt.Sprintf(format, args...)
	w.violations = append(w.violations, v)
	w.report("%s", v)
}

// apply checks r against the key as the responses before it left it.
func (w *watchCheck) apply(r WatchResponse) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.responses++
	if r.Index <= w.last && !(r.Bookmark && r.Index == w.last) {
		w.violate("response at index %d after index %d", r.Index, w.last)
	}
	w.last = max(w.last, r.Index)
	if r.Snapshot {
		w.holders, w.waiters = nil, nil
		if len(r.Keys) == 1 {
			w.holders, w.waiters = slices.Clone(r.Keys[0].Holders), slices.Clone(r.Keys[0].Waiters)
		}
		for _, h := range w.holders {
			w.top = max(w.top, h.Token)
			w.granted[h.Token] = true
		}
		if r.Resync {
			w.resyncs++
			w.excused = w.top
		}
		return
	}
	find := func(list []Holder, e WatchEvent) int {
		return slices.IndexFunc(list, func(h Holder) bool { return h.ShardSession == e.Holder.ShardSession && h.Request == e.Holder.Request })
	}
	for _, e := range r.Events {
		switch e.Kind {
		case Granted:
			if i := find(w.waiters, e); i >= 0 {
				w.waiters = slices.Delete(w.waiters, i, i+1)
			}
			if e.Holder.Token <= w.top {
				w.violate("index %d: grant of token %d after token %d", r.Index, e.Holder.Token, w.top)
			}
			w.top = max(w.top, e.Holder.Token)
			w.granted[e.Holder.Token] = true
			w.holders = append(w.holders, e.Holder)
			if len(w.holders) > 1 {
				w.violate("index %d: token %d granted while %d other holders were not released (a missed release)", r.Index, e.Holder.Token, len(w.holders)-1)
			}
		case Released, Expired:
			if i := find(w.holders, e); i >= 0 {
				w.holders = slices.Delete(w.holders, i, i+1)
			} else {
				w.violate("index %d: %v of token %d, which no event granted (a missed grant)", r.Index, e.Kind, e.Holder.Token)
			}
		case Queued:
			w.waiters = append(w.waiters, e.Holder)
		case Cancelled:
			if i := find(w.waiters, e); i >= 0 {
				w.waiters = slices.Delete(w.waiters, i, i+1)
			} else {
				w.violate("index %d: a waiter cancelled that no event queued", r.Index)
			}
		case ValueChanged:
			if find(w.holders, e) < 0 {
				w.violate("index %d: a value set by a holder no event granted", r.Index)
			}
		}
	}
}

// startWatchChecks watches each of lr's keys until ctx ends, through the
// peers of lr's cluster as they are now, from before the load starts
// (it returns once each watch delivered its first snapshot), and reports each violation to
// lr as it finds it; finish waits for the watchers to see every grant the
// load recorded (at most 20 s, unless they found a violation already),
// stops them, reports the grants never delivered, and logs a summary.
func startWatchChecks(ctx context.Context, lr *loadRun, logf func(string, ...any)) (finish func()) {
	peers := slices.Clone(lr.fc.peers)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	checks := make([]*watchCheck, len(lr.keys))
	var started sync.WaitGroup
	for i, key := range lr.keys {
		w := &watchCheck{key: key, report: lr.violate, granted: map[uint64]bool{}}
		checks[i] = w
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			defer once.Do(started.Done)
			for turn := i; ctx.Err() == nil; turn++ {
				n := peers[turn%len(peers)].node()
				if n == nil {
					sleepCtx(ctx, 20*time.Millisecond)
					continue
				}
				w.mu.Lock()
				after := w.last
				w.restarts++
				w.mu.Unlock()
				ch, err := n.Watch(ctx, key, WithStartIndex(after))
				if err != nil {
					sleepCtx(ctx, 20*time.Millisecond)
					continue
				}
				for r := range ch {
					if r.Err != nil {
						break // its peer closed: resume on another
					}
					w.apply(r)
					once.Do(started.Done)
				}
			}
		}()
	}
	started.Wait() // each watch began before the load: it sees every grant
	return func() {
		// The grants the load recorded, by key.
		lr.mu.Lock()
		want := map[string][]uint64{}
		for k := range lr.granted {
			want[k.key] = append(want[k.key], k.token)
		}
		lr.mu.Unlock()
		missing := func(w *watchCheck) []uint64 {
			w.mu.Lock()
			defer w.mu.Unlock()
			var miss []uint64
			for _, tok := range want[w.key] {
				if tok > w.excused && !w.granted[tok] {
					miss = append(miss, tok)
				}
			}
			return miss
		}
		found := func() bool {
			for _, w := range checks {
				w.mu.Lock()
				n := len(w.violations)
				w.mu.Unlock()
				if n > 0 {
					return true
				}
			}
			return false
		}
		deadline := time.Now().Add(20 * time.Second)
		for _, w := range checks {
			for len(missing(w)) > 0 && time.Now().Before(deadline) && !found() {
				time.Sleep(20 * time.Millisecond)
			}
		}
		cancel()
		wg.Wait()
		for _, w := range checks {
			miss := missing(w)
			w.mu.Lock()
			if len(miss) > 0 {
				slices.Sort(miss)
				w.violate("%d grants a worker got were never delivered, tokens %v, with %d resyncs", len(miss), miss[:min(len(miss), 10)], w.resyncs)
			}
			logf("watch %s: %d responses up to index %d, %d grants seen of %d recorded, %d resyncs, %d starts, %d violations",
				w.key, w.responses, w.last, len(w.granted), len(want[w.key]), w.resyncs, w.restarts, len(w.violations))
			w.mu.Unlock()
		}
	}
}
