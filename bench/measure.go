package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

// Footprint is what lockmesh costs when it is not busy: start-up time, idle
// CPU and memory per held lock, each measured on 3 peers in this process
// with the default config (16 shards, fsync on).
type Footprint struct {
	// StartupSeconds lists, per attempt, the time from the first node.Start
	// until every peer is ready and has served one lock.
	StartupSeconds []float64 `json:"startup_seconds"`
	// IdleSeconds is the window over which idle CPU was measured.
	IdleSeconds float64 `json:"idle_seconds"`
	// IdleCorePerPeer is the process's CPU time over the idle window,
	// divided by the window and by 3 peers: 0.01 is 1% of one core.
	IdleCorePerPeer float64 `json:"idle_core_per_peer"`
	// Memory holds one entry per held-lock count measured.
	Memory []MemoryUse `json:"memory"`
	// RaftFloor is one replicated commit at a time on a bare Raft group
	// (-floor); nil when not measured.
	RaftFloor *RaftFloor `json:"raft_floor,omitempty"`
}

// MemoryUse is the growth of the process when one process (3 peers, so 3
// replicas of every shard, plus the client's Lock objects) holds Locks
// locks on distinct keys.
type MemoryUse struct {
	Locks        int     `json:"locks"`          // locks asked for
	Held         int     `json:"held"`           // locks actually held when measured
	Seconds      float64 `json:"seconds"`        // time to take them
	RSSGrowth    int64   `json:"rss_growth"`     // bytes, after a GC both times
	BytesPerLock float64 `json:"bytes_per_lock"` // RSSGrowth / Held
	HeapPerLock  float64 `json:"heap_per_lock"`  // Go heap in use growth / Held
	// ServerHeld and ServerBytesPerLock are from lockmesh as 3 server
	// processes with a client-only node in the bench process: the locks
	// held, and each server's RSS growth divided by them (no forced GC).
	ServerHeld         int       `json:"server_held,omitempty"`
	ServerBytesPerLock []float64 `json:"server_bytes_per_lock,omitempty"`
	Note               string    `json:"note,omitempty"`
}

// FootprintOptions says what MeasureFootprint does; zero fields skip that
// measurement.
type FootprintOptions struct {
	Startups    int           // start-ups to time
	Idle        time.Duration // idle window
	Locks       []int         // held-lock counts, each on a fresh cluster
	LockTimeout time.Duration // bound on taking one count's locks
	Concurrency int           // workers taking the locks (default 64)
	// HeapProfiles, if set, is a directory where each lockmesh-3proc
	// server's heap profile (after a GC) is written while it holds the
	// locks: heap-peer-N-LOCKS.pb.gz, for go tool pprof.
	HeapProfiles string
	Progress     io.Writer
}

// MeasureFootprint measures start-up time, idle CPU per peer and memory per
// held lock of lockmesh.
func MeasureFootprint(ctx context.Context, o FootprintOptions) (Footprint, error) {
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Concurrency == 0 {
		o.Concurrency = 64
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = 5 * time.Minute
	}
	var fp Footprint
	for i := 0; i < o.Startups; i++ {
		err := withCluster(ctx, func(d time.Duration, _ []*node.Node) error {
			fp.StartupSeconds = append(fp.StartupSeconds, d.Seconds())
			fmt.Fprintf(o.Progress, "[footprint] start-up %d: %v\n", i+1, d.Round(time.Millisecond))
			return nil
		})
		if err != nil {
			return fp, err
		}
	}
	if o.Idle > 0 {
		err := withCluster(ctx, func(_ time.Duration, _ []*node.Node) error {
			pause(ctx, 2*time.Second) // let elections and bootstrap chatter settle
			self := []int{os.Getpid()}
			c0, t0 := cpuSeconds(self), time.Now()
			if err := tick(ctx, o.Idle, func() {
				fmt.Fprintf(o.Progress, "[footprint] idle %.0fs: %.2f%% of a core per peer so far\n",
					time.Since(t0).Seconds(), 100*(cpuSeconds(self)-c0)/time.Since(t0).Seconds()/3)
			}); err != nil {
				return err
			}
			fp.IdleSeconds = time.Since(t0).Seconds()
			fp.IdleCorePerPeer = (cpuSeconds(self) - c0) / fp.IdleSeconds / 3
			return nil
		})
		if err != nil {
			return fp, err
		}
	}
	for _, n := range o.Locks {
		var mu MemoryUse
		err := withCluster(ctx, func(_ time.Duration, peers []*node.Node) error {
			var err error
			mu, err = holdMany(ctx, peers, n, o)
			return err
		})
		if err != nil {
			return fp, err
		}
		if err := holdManyOnServers(ctx, n, o, &mu); err != nil {
			if !errors.Is(err, ErrSkip) {
				return fp, err
			}
			mu.Note += "; servers: " + err.Error()
		}
		fp.Memory = append(fp.Memory, mu)
	}
	return fp, nil
}

// withCluster starts 3 fresh peers, runs f with the start-up time, and
// stops them.
func withCluster(ctx context.Context, f func(time.Duration, []*node.Node) error) error {
	dir, err := os.MkdirTemp("", "lockbench-footprint-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	peers, err := StartLockmesh(sctx, dir, 3, nil)
	if err != nil {
		return err
	}
	defer closePeers(peers)
	return f(time.Since(t0), peers)
}

func settledMemory() (rss int64, heap uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, _ = rssBytes()
	return rss, ms.HeapInuse
}

// holdMany takes n locks on distinct keys, spread over the peers, and
// measures the growth of the process while they are all held.
func holdMany(ctx context.Context, peers []*node.Node, n int, o FootprintOptions) (MemoryUse, error) {
	mu := MemoryUse{Locks: n}
	rss0, heap0 := settledMemory()
	held := takeLocks(ctx, peers, n, o, &mu)
	rss1, heap1 := settledMemory()
	mu.RSSGrowth = rss1 - rss0
	if mu.Held > 0 {
		mu.BytesPerLock = float64(mu.RSSGrowth) / float64(mu.Held)
		mu.HeapPerLock = float64(int64(heap1)-int64(heap0)) / float64(mu.Held)
	}
	fmt.Fprintf(o.Progress, "[footprint] %d locks held: RSS +%d MB, %.0f bytes/lock (Go heap %.0f bytes/lock), taken in %.1fs\n",
		mu.Held, mu.RSSGrowth>>20, mu.BytesPerLock, mu.HeapPerLock, mu.Seconds)
	runtime.KeepAlive(held)
	return mu, nil
}

// holdManyOnServers takes n locks through the client-only node of
// lockmesh-3proc and measures the RSS growth of each server process, which
// holds one replica of every lock and none of the client's Lock objects.
// The servers run as deployed (GOGC=100, no forced GC), so this is what a
// peer's resident memory grows by, garbage included.
func holdManyOnServers(ctx context.Context, n int, o FootprintOptions, mu *MemoryUse) error {
	dir, err := os.MkdirTemp("", "lockbench-footprint-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sys, err := newLockmesh3Proc(Env{Dir: dir})
	if err != nil {
		return err
	}
	s := sys.(*lockmesh3Proc)
	s.http = o.HeapProfiles != ""
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	defer s.Stop()
	if err := s.Start(sctx); err != nil {
		return err
	}
	pause(ctx, 2*time.Second)
	pids := s.PIDs()
	before := make([]int64, len(pids))
	for i, pid := range pids {
		if before[i], err = rssOf(pid); err != nil {
			return err
		}
	}
	var served MemoryUse
	held := takeLocks(ctx, []*node.Node{s.client}, n, o, &served)
	pause(ctx, 2*time.Second)
	var sum float64
	for i, pid := range pids {
		after, err := rssOf(pid)
		if err != nil {
			return err
		}
		if served.Held > 0 {
			per := float64(after-before[i]) / float64(served.Held)
			mu.ServerBytesPerLock = append(mu.ServerBytesPerLock, per)
			sum += per
		}
	}
	mu.ServerHeld = served.Held
	if o.HeapProfiles != "" {
		if err := saveHeapProfiles(ctx, s.HTTPAddrs(), o.HeapProfiles, n); err != nil {
			return err
		}
	}
	if served.Note != "" {
		mu.Note += "; servers: " + served.Note
	}
	fmt.Fprintf(o.Progress, "[footprint] %d locks held by 3 server processes: %.0f bytes RSS per lock per server (mean), taken in %.1fs\n",
		served.Held, sum/float64(len(pids)), served.Seconds)
	runtime.KeepAlive(held)
	return nil
}

// takeLocks takes n locks on distinct keys with o.Concurrency workers spread
// over nodes, recording in mu how many it got, how long it took and the
// first error. The locks are returned, still held.
func takeLocks(ctx context.Context, nodes []*node.Node, n int, o FootprintOptions, mu *MemoryUse) [][]*node.Lock {
	ctx, cancel := context.WithTimeout(ctx, o.LockTimeout)
	defer cancel()
	held := make([][]*node.Lock, o.Concurrency)
	var next, errs atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := range held {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := nodes[w%len(nodes)]
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				l, err := p.Lock(ctx, fmt.Sprintf("bench/held/%d", i))
				if err != nil {
					if ctx.Err() == nil {
						errs.Add(1)
						firstErr.CompareAndSwap(nil, &err)
					}
					continue
				}
				held[w] = append(held[w], l)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tk := time.NewTicker(5 * time.Second)
	defer tk.Stop()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tk.C:
			fmt.Fprintf(o.Progress, "[footprint] holding %d/%d locks after %.0fs\n", min(next.Load(), int64(n)), n, time.Since(t0).Seconds())
		}
	}
	mu.Seconds = time.Since(t0).Seconds()
	for _, h := range held {
		mu.Held += len(h)
	}
	if mu.Held < n {
		mu.Note = fmt.Sprintf("only %d of %d locks taken in %v", mu.Held, n, o.LockTimeout)
	}
	if e := firstErr.Load(); e != nil {
		mu.Note += fmt.Sprintf("; %d errors, first: %v", errs.Load(), *e)
	}
	return held
}

// WriteFootprint writes fp as a short Markdown section.
func WriteFootprint(w io.Writer, fp Footprint) error {
	var b []byte
	b = fmt.Appendf(b, "| measurement | value |\n|---|---|\n")
	for i, s := range fp.StartupSeconds {
		b = fmt.Appendf(b, "| start-up %d (3 peers, fresh dirs, until each served a lock) | %.2f s |\n", i+1, s)
	}
	if fp.IdleSeconds > 0 {
		b = fmt.Appendf(b, "| idle CPU per peer (3 peers, 16 shards, %.0f s) | %.2f%% of a core |\n", fp.IdleSeconds, 100*fp.IdleCorePerPeer)
	}
	for _, m := range fp.Memory {
		note := ""
		if m.Note != "" {
			note = " (" + m.Note + ")"
		}
		b = fmt.Appendf(b, "| memory per held lock, %d held (one process: 3 replicas + client) | %.0f bytes RSS, %.0f bytes Go heap; taken in %.0f s%s |\n",
			m.Held, m.BytesPerLock, m.HeapPerLock, m.Seconds, note)
		if len(m.ServerBytesPerLock) > 0 {
			b = fmt.Appendf(b, "| memory per held lock per server, %d held (3 server processes, client elsewhere) | %s bytes RSS |\n",
				m.ServerHeld, joinFloats(m.ServerBytesPerLock))
		}
	}
	if f := fp.RaftFloor; f != nil {
		b = fmt.Appendf(b, "| one replicated commit at a time (bare 3-replica Raft group, %.0f s) | p50 %.2f ms, p99 %.2f ms: %.0f commits/s, the floor of hand-offs/s |\n",
			f.Seconds, f.P50ms, f.P99ms, f.FloorHandoffsSec)
	}
	_, err := w.Write(b)
	return err
}

func joinFloats(fs []float64) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, fmt.Sprintf("%.0f", f))
	}
	return strings.Join(parts, " / ")
}

// saveHeapProfiles writes the heap profile of each server at addrs (taken
// after a GC, so it is the live heap) into dir as heap-peer-N-LOCKS.pb.gz.
func saveHeapProfiles(ctx context.Context, addrs []string, dir string, locks int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, addr := range addrs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/heap?gc=1", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("heap profile of peer-%d: %w", i+1, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s", resp.Status)
		}
		if err != nil {
			return fmt.Errorf("heap profile of peer-%d: %w", i+1, err)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("heap-peer-%d-%d.pb.gz", i+1, locks)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
