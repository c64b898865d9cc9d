package node

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/lockfsm"
)

var (
	watchMemEvents = flag.Int("lockmesh.watchmem.events", 20000, "events TestSlowWatcherMemory makes while its watch is not read")
)

// lagRecorder pairs each grant's time on its holder's side (Lock
// returned) with the time a watch or an observer delivered it, in
// whichever order they come.
type lagRecorder struct {
	mu        sync.Mutex
	granted   map[uint64]time.Time
	delivered map[uint64]time.Time
	lags      []time.Duration // delivery minus grant; negative when the watch was first
}

func newLagRecorder() *lagRecorder {
	return &lagRecorder{granted: map[uint64]time.Time{}, delivered: map[uint64]time.Time{}}
}

func (r *lagRecorder) grant(token uint64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if d, ok := r.delivered[token]; ok {
		r.lags = append(r.lags, d.Sub(at))
		delete(r.delivered, token)
		return
	}
	r.granted[token] = at
}

func (r *lagRecorder) deliver(token uint64, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if g, ok := r.granted[token]; ok {
		r.lags = append(r.lags, at.Sub(g))
		delete(r.granted, token)
		return
	}
	r.delivered[token] = at
}

// quantiles returns the p50 and p99 of the lags, and how many were
// negative (the watch delivered before the holder's Lock returned).
func (r *lagRecorder) quantiles() (p50, p99 time.Duration, n, early int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lags := slices.Clone(r.lags)
	slices.Sort(lags)
	if len(lags) == 0 {
		return 0, 0, 0, 0
	}
	for _, l := range lags {
		if l < 0 {
			early++
		}
	}
	return lags[len(lags)/2], lags[len(lags)*99/100], len(lags), early
}

// BenchmarkWatchLag measures, under the hot-key load (16 workers on two
// peers lock and unlock one key), how long after an entry is first
// applied (by any replica: about when it committed) a watch of the key on
// the third peer delivers it (commit-p50/p99), and how long after a
// holder's Lock returns the watch delivers its grant and an Observe of
// the key (as an election) the new leader (watch-, observe-p50/p99;
// negative when they were first). In-process cluster, in-memory disks:
// lockmesh's own latency, not fsync's.
//
//	go test ./node -run '^$' -bench WatchLag -benchtime 20000x
func BenchmarkWatchLag(b *testing.B) {
	var applied sync.Map // index -> the first time a replica applied it
	peers := startCluster(b, clusterOpts{peers: 3, rf: 3, shards: 1, ttl: 10 * time.Second, hook: func(h *peer.Hooks) {
		h.OnApply = func(shard, index uint64, _ []lockfsm.Grant) {
			if shard != layout.MetaShard { // the one lock shard's entries
				applied.LoadOrStore(index, time.Now())
			}
		}
	}})
	var commitMu sync.Mutex
	var commitLags []time.Duration
	ctx, cancel := context.WithCancel(ctxT(b, time.Hour))
	defer cancel()
	const key = "hot"
	watch, err := peers[2].node.Watch(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	observe, err := peers[2].node.Observe(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	watched, observed := newLagRecorder(), newLagRecorder()
	var readers sync.WaitGroup
	readers.Go(func() {
		for r := range watch {
			now := time.Now()
			if at, ok := applied.Load(r.Index); ok && len(r.Events) > 0 {
				commitMu.Lock()
				commitLags = append(commitLags, now.Sub(at.(time.Time)))
				commitMu.Unlock()
			}
			for _, e := range r.Events {
				if e.Kind == Granted {
					watched.deliver(e.Holder.Token, now)
				}
			}
		}
	})
	readers.Go(func() {
		for ev := range observe {
			if ev.Leader != nil {
				observed.deliver(ev.Leader.Term, time.Now())
			}
		}
	})
	var ops atomic.Int64
	b.ResetTimer()
	var workers sync.WaitGroup
	for w := range 16 {
		n := peers[w%2].node
		workers.Go(func() {
			for ops.Add(1) <= int64(b.N) {
				l, err := n.Lock(ctx, key)
				if err != nil {
					b.Error(err)
					return
				}
				now := time.Now()
				watched.grant(l.Token(), now)
				observed.grant(l.Token(), now)
				if err := l.Unlock(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	workers.Wait()
	b.StopTimer()
	time.Sleep(500 * time.Millisecond) // the last deliveries
	cancel()
	readers.Wait()
	slices.Sort(commitLags)
	if len(commitLags) > 0 {
		p50, p99 := commitLags[len(commitLags)/2], commitLags[len(commitLags)*99/100]
		b.ReportMetric(float64(p50.Microseconds()), "commit-p50-µs")
		b.ReportMetric(float64(p99.Microseconds()), "commit-p99-µs")
		b.Logf("commit to delivery: %d entries, p50 %v p99 %v", len(commitLags), p50, p99)
	}
	for name, r := range map[string]*lagRecorder{"watch": watched, "observe": observed} {
		p50, p99, n, early := r.quantiles()
		b.ReportMetric(float64(p50.Microseconds()), name+"-p50-µs")
		b.ReportMetric(float64(p99.Microseconds()), name+"-p99-µs")
		b.Logf("%s: %d grants delivered, lag p50 %v p99 %v (%d delivered before the holder's Lock returned)", name, n, p50, p99, early)
	}
}

// A watch whose consumer never reads holds up its buffer and one host's
// answer, however many events follow: the heap does not grow with them,
// and when the consumer reads again it gets what it held and then a
// Resync. The figure in docs/WATCH.md is from
//
//	go test ./node -run SlowWatcherMemory -v -args -lockmesh.watchmem.events=1000000
func TestSlowWatcherMemory(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 1, ttl: 10 * time.Second})
	n := peers[0].node
	ctx := ctxT(t, 30*time.Minute)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	load := func(events int) {
		var made atomic.Int64
		var wg sync.WaitGroup
		for w := range 32 {
			wg.Go(func() {
				for i := 0; made.Add(2) <= int64(events); i++ {
					l, err := n.Lock(ctx, fmt.Sprintf("{mem}/%d/%d", w, i%100))
					if err != nil {
						t.Error(err)
						return
					}
					l.Release()
				}
			})
		}
		wg.Wait()
	}
	measure := func(what string) {
		before, start := heap(), time.Now()
		load(*watchMemEvents)
		after := heap()
		t.Logf("%d events in %v %s: heap %d MiB before, %d MiB after (%+d KiB)", *watchMemEvents,
			time.Since(start).Round(time.Millisecond), what, before>>20, after>>20, (int64(after)-int64(before))>>10)
	}
	// Warm up (the journal fills), then the control: what the heap gains
	// with no watch (the in-memory Raft log until it is compacted, the
	// sessions' records) is not a watch's.
	load(40000)
	measure("with no watch")

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	watch, err := n.Watch(wctx, "{mem}/", WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	first := next(t, watch)
	measure("while a watch was not read")
	// It reads again: what it held up, then a Resync past it.
	last := first.Index
	for {
		r := next(t, watch)
		if r.Index <= last {
			t.Fatalf("index %d after %d", r.Index, last)
		}
		last = r.Index
		if r.Resync {
			break
		}
	}
}
