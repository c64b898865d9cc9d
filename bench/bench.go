// Package bench is lockmesh's throughput and latency harness. It starts each
// system under test itself, drives it with a fixed set of workloads at a
// sweep of concurrencies, checks every operation for mutual exclusion and
// fencing-token order, and writes the results as JSON lines, a Markdown
// table and a hand-written SVG plot.
//
// The package imports only the standard library and lockmesh's node
// package. Comparators with heavier clients (etcd, ZooKeeper, Redis) live in
// the separate module under bench/compare and add themselves with Register,
// so the library's go.mod never grows their dependencies.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"sync"
	"time"
)

// ErrBusy is returned (wrapped) by Worker.TryLock when the key is held by
// someone else. It is the expected outcome of a refused try, not an error.
var ErrBusy = errors.New("bench: key is locked")

// ErrSkip is returned (wrapped) by a Factory or System.Start when the system
// cannot run on this machine, for example because its server binary is not
// installed. Run prints the reason and goes on with the other systems.
var ErrSkip = errors.New("bench: system skipped")

// System is one lock service under test. Run calls Start once, then
// NewWorker for every worker of every run, then Stop, from one goroutine.
type System interface {
	// Name is the name used on the command line and in the results.
	Name() string
	// Start starts the servers (bound to 127.0.0.1 only) and returns once
	// they serve lock calls. It must not leave processes behind on error.
	Start(ctx context.Context) error
	// NewWorker returns a client with its own connection or session, for
	// use by one goroutine.
	NewWorker(id int) (Worker, error)
	// Stop stops everything Start started, killing processes by id. It is
	// called even when Start failed.
	Stop() error
	// PIDs lists the server processes started by Start, for CPU accounting.
	// In-process systems return nil: the bench process is always counted.
	PIDs() []int
}

// Settler is implemented by systems that keep reorganising themselves for
// a while after they serve (lockmesh evens out shard leadership). Run calls
// Settle after timing start-up and before the first measured run, so that
// runs measure the steady state rather than leadership moves.
type Settler interface {
	Settle(ctx context.Context) error
}

// Worker is one client of a System, used by one goroutine.
type Worker interface {
	// Lock blocks until key is held. token is the grant's fencing token
	// when the system has one (hasToken); unlock releases the lock.
	Lock(ctx context.Context, key string) (token uint64, hasToken bool, unlock func(context.Context) error, err error)
	// TryLock is Lock that returns an error wrapping ErrBusy at once when
	// the key is held.
	TryLock(ctx context.Context, key string) (token uint64, hasToken bool, unlock func(context.Context) error, err error)
	// Close releases the worker's connection or session.
	Close() error
}

// RWWorker is a Worker of a system with a read/write lock. The
// rw-read-heavy workload runs only on systems whose workers implement it.
type RWWorker interface {
	Worker
	// RLock blocks until key is held for reading (shared with other
	// readers); WLock until it is held for writing (alone). token and
	// hasToken are as for Lock: a grant's token must be above the last
	// writer's, and a writer's above every earlier grant's.
	RLock(ctx context.Context, key string) (token uint64, hasToken bool, unlock func(context.Context) error, err error)
	WLock(ctx context.Context, key string) (token uint64, hasToken bool, unlock func(context.Context) error, err error)
}

// SemaphoreWorker is a Worker of a system with a counting semaphore. The
// semaphore workload runs only on systems whose workers implement it.
type SemaphoreWorker interface {
	Worker
	// Acquire blocks until n of the permits permits of key are held by
	// this worker; unlock gives them back.
	Acquire(ctx context.Context, key string, permits, n int) (unlock func(context.Context) error, err error)
}

// MultiWorker is a Worker of a system that takes several keys as one
// grant. The lockall workload runs only on systems whose workers
// implement it (lockall-seq runs on every system: it takes the keys with
// Lock, one after another).
type MultiWorker interface {
	Worker
	// LockAll blocks until every key is held, and returns each key's
	// token in the order of keys when the system has them (hasToken).
	LockAll(ctx context.Context, keys []string) (tokens []uint64, hasToken bool, unlock func(context.Context) error, err error)
}

// Factory makes a System. It returns an error wrapping ErrSkip when the
// system cannot run here.
type Factory func(env Env) (System, error)

// Env is what a Factory gets from the harness.
type Env struct {
	// Dir is a fresh temporary directory for the system's data; the harness
	// removes it after Stop.
	Dir string
	// Log receives the system's own notes (not the servers' logs).
	Log io.Writer
	// Shards is the lock shard count lockmesh clusters are created with;
	// 0 keeps node's default. Other systems ignore it.
	Shards int
}

var (
	registryMu sync.Mutex
	registry   = map[string]Factory{}
)

// Register makes a system available to Run under name. It replaces an
// earlier registration of the same name. lockmesh is registered by the
// package itself.
func Register(name string, f Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	registry[name] = f
}

// Systems returns the registered system names, sorted.
func Systems() []string {
	registryMu.Lock()
	defer registryMu.Unlock()
	names := make([]string, 0, len(registry))
	for n := range registry {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func lookup(name string) (Factory, bool) {
	registryMu.Lock()
	defer registryMu.Unlock()
	f, ok := registry[name]
	return f, ok
}

// Options says what Run measures.
type Options struct {
	Systems     []string      // registered names, in order
	Workloads   []string      // see Workloads
	Concurrency []int         // workers per run
	Duration    time.Duration // measured window per run
	Warmup      time.Duration // unmeasured window before each run
	Hold        time.Duration // how long the hold workload holds each lock
	Keys        int           // key space of the uncontended and hold workloads
	OpTimeout   time.Duration // bound on one lock call; a timeout is an error
	Shards      int           // lockmesh's shard count; 0 keeps node's default
	Progress    io.Writer     // one progress line per second; nil for none
}

func (o *Options) setDefaults() {
	if len(o.Systems) == 0 {
		o.Systems = []string{"lockmesh"}
	}
	if len(o.Workloads) == 0 {
		o.Workloads = []string{"uncontended", "contended"}
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 16, 64}
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Warmup == 0 {
		o.Warmup = time.Second
	}
	if o.Hold == 0 {
		o.Hold = 10 * time.Millisecond
	}
	if o.Keys == 0 {
		o.Keys = 100_000
	}
	if o.OpTimeout == 0 {
		o.OpTimeout = 30 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// Result is one system × workload × concurrency run. Latencies are of one
// op: lock + unlock (try: one TryLock, plus the unlock when it succeeded;
// hold, rw-read-heavy and semaphore: the time held too); grant latencies
// are of the lock call alone, until every key of the op is held.
type Result struct {
	System         string  `json:"system"`
	Workload       string  `json:"workload"`
	Concurrency    int     `json:"concurrency"`
	Seconds        float64 `json:"seconds"`
	Ops            int64   `json:"ops"`
	OpsPerSec      float64 `json:"ops_per_sec"`
	Acquired       int64   `json:"acquired"` // try: successful tries; else = ops
	Handoffs       int64   `json:"handoffs"` // acquisitions by a worker other than the key's previous holder
	HandoffsPerSec float64 `json:"handoffs_per_sec"`
	P50ms          float64 `json:"p50_ms"`
	P99ms          float64 `json:"p99_ms"`
	P999ms         float64 `json:"p999_ms"`
	MaxMs          float64 `json:"max_ms"`
	GrantP50ms     float64 `json:"grant_p50_ms"`
	GrantP99ms     float64 `json:"grant_p99_ms"`
	Errors         int64   `json:"errors"`
	FirstError     string  `json:"first_error,omitempty"`
	Violations     int64   `json:"violations"`
	FirstViolation string  `json:"first_violation,omitempty"`
	Fencing        string  `json:"fencing"` // "checked" or "n/a" (system has no tokens)
	CPUSeconds     float64 `json:"cpu_seconds"`
	CPUMicrosPerOp float64 `json:"cpu_us_per_op"` // CPUSeconds per op
	// FlushesPerOp is the flushes the disk under the systems' data
	// completed per op (each fsync or fdatasync that reached it), counted
	// machine-wide from /proc/diskstats; nil where that is not available.
	FlushesPerOp *float64 `json:"flushes_per_op,omitempty"`
	// CommandsPerEntry is lockmesh's lock commands per Raft entry over the
	// run (EntryCounter); nil for other systems.
	CommandsPerEntry *float64 `json:"commands_per_entry,omitempty"`
	StartupSeconds   float64  `json:"startup_seconds"` // of the system, once per system
}

// EntryCounter is implemented by systems that count their replicated
// log's entries and the commands in them (in-process lockmesh), so that
// results show how well commands batch.
type EntryCounter interface {
	// RaftCounts returns the entries and commands applied so far.
	RaftCounts() (entries, commands uint64)
}

// Run measures every system × workload × concurrency in opts. Each system
// is started once, runs every workload and concurrency, and is stopped
// before the next starts. A system that cannot run here (ErrSkip) is
// skipped with a note on opts.Progress, and so is a workload whose lock a
// system does not have (see RWWorker, SemaphoreWorker, MultiWorker). Run
// returns the results so far and
// the first error when ctx ends or a system fails to start.
func Run(ctx context.Context, opts Options) ([]Result, error) {
	opts.setDefaults()
	for _, w := range opts.Workloads {
		if !slices.Contains(Workloads, w) {
			return nil, fmt.Errorf("unknown workload %q (have %v)", w, Workloads)
		}
	}
	for _, s := range opts.Systems {
		if _, ok := lookup(s); !ok {
			return nil, fmt.Errorf("unknown system %q (have %v)", s, Systems())
		}
	}
	var results []Result
	for _, name := range opts.Systems {
		rs, err := runSystem(ctx, name, opts)
		results = append(results, rs...)
		if errors.Is(err, ErrSkip) {
			fmt.Fprintf(opts.Progress, "skipping %s: %v\n", name, err)
			continue
		}
		if err != nil {
			return results, fmt.Errorf("%s: %w", name, err)
		}
	}
	return results, nil
}

func runSystem(ctx context.Context, name string, opts Options) ([]Result, error) {
	f, _ := lookup(name)
	dir, err := os.MkdirTemp("", "lockbench-"+name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sys, err := f(Env{Dir: dir, Log: opts.Progress, Shards: opts.Shards})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := sys.Stop(); err != nil {
			fmt.Fprintf(opts.Progress, "%s: stop: %v\n", name, err)
		}
	}()
	t0 := time.Now()
	startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	err = sys.Start(startCtx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	startup := time.Since(t0)
	fmt.Fprintf(opts.Progress, "%s started in %v\n", name, startup.Round(time.Millisecond))
	if st, ok := sys.(Settler); ok {
		t1 := time.Now()
		settleCtx, cancel := context.WithTimeout(ctx, time.Minute)
		err := st.Settle(settleCtx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("settle: %w", err)
		}
		fmt.Fprintf(opts.Progress, "%s settled in %v\n", name, time.Since(t1).Round(time.Millisecond))
	}
	var results []Result
	for _, wl := range opts.Workloads {
		for _, c := range opts.Concurrency {
			if err := ctx.Err(); err != nil {
				return results, err
			}
			r, err := runOne(ctx, sys, wl, c, opts)
			if errors.Is(err, ErrSkip) {
				fmt.Fprintf(opts.Progress, "skipping %s %s: %v\n", name, wl, err)
				break // the system lacks this workload's lock at every concurrency
			}
			if err != nil {
				return results, fmt.Errorf("%s c=%d: %w", wl, c, err)
			}
			r.StartupSeconds = startup.Seconds()
			results = append(results, r)
			fmt.Fprintf(opts.Progress, "%s\n", r.summary())
		}
	}
	return results, nil
}

// optNum renders an optional measurement, "n/a" when it was not taken.
func optNum(v *float64) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", *v)
}

func (r Result) summary() string {
	s := fmt.Sprintf("= %s %s c=%d: %.0f ops/s", r.System, r.Workload, r.Concurrency, r.OpsPerSec)
	if r.Workload == "contended" || r.Workload == "try" {
		s += fmt.Sprintf(", %.0f handoffs/s", r.HandoffsPerSec)
	}
	s += fmt.Sprintf(", p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, grant p50 %.2f ms, p99 %.2f ms, errors %d, violations %d, cpu %.1fs (%.0f us/op), flushes/op %s, cmds/entry %s",
		r.P50ms, r.P99ms, r.P999ms, r.GrantP50ms, r.GrantP99ms, r.Errors, r.Violations, r.CPUSeconds,
		r.CPUMicrosPerOp, optNum(r.FlushesPerOp), optNum(r.CommandsPerEntry))
	if r.FirstError != "" {
		s += "\n  first error: " + r.FirstError
	}
	if r.FirstViolation != "" {
		s += "\n  first violation: " + r.FirstViolation
	}
	return s
}
