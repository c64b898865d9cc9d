package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Workloads lists the workloads Run knows:
//
//   - uncontended: each op locks and unlocks a random key out of
//     Options.Keys, so workers almost never meet.
//   - contended: every worker locks and unlocks one hot key; handoffs
//     counts acquisitions by a worker other than the previous holder.
//   - hold: like uncontended, but each lock is held for Options.Hold, so
//     many locks are held at once.
//   - try: every worker calls TryLock on one hot key, unlocking at once
//     when it got it; an op is one try, refused or not.
var Workloads = []string{"uncontended", "contended", "hold", "try"}

const hotKey = "bench/hot"

// checker is the critical sections' own view of the lock: per key, who is
// inside and the highest fencing token seen. It never trusts the system.
type checker struct {
	stripes [64]struct {
		mu   sync.Mutex
		keys map[string]*keyState
	}
	recording  atomic.Bool
	handoffs   atomic.Int64
	violations atomic.Int64
	firstViol  atomic.Pointer[string]
	sawToken   atomic.Bool // the system handed out fencing tokens
}

type keyState struct {
	inside     int // worker id + 1 inside the critical section, 0 if none
	lastHolder int // worker id + 1 of the previous holder, 0 if none
	lastToken  uint64
	tokened    bool // lastToken is set: a first grant may carry token 0 (ZooKeeper's first sequence number)
}

func newChecker() *checker {
	c := &checker{}
	for i := range c.stripes {
		c.stripes[i].keys = map[string]*keyState{}
	}
	return c
}

func (c *checker) stripe(key string) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	return int(h % uint32(len(c.stripes)))
}

func (c *checker) violate(format string, args ...any) {
	c.violations.Add(1)
	msg := fmt.Sprintf(format, args...)
	c.firstViol.CompareAndSwap(nil, &msg)
}

// enter records that worker holds key with token, and flags a second holder
// or a token that did not grow.
func (c *checker) enter(key string, worker int, token uint64, hasToken bool) {
	s := &c.stripes[c.stripe(key)]
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[key]
	if k == nil {
		k = &keyState{}
		s.keys[key] = k
	}
	if k.inside != 0 {
		c.violate("key %q: worker %d entered while worker %d is inside", key, worker, k.inside-1)
	}
	if hasToken {
		if k.tokened && token <= k.lastToken {
			c.violate("key %q: worker %d got token %d, not above the previous grant's %d", key, worker, token, k.lastToken)
		}
		k.lastToken = max(k.lastToken, token)
		k.tokened = true
	}
	if k.lastHolder != 0 && k.lastHolder != worker+1 && c.recording.Load() {
		c.handoffs.Add(1)
	}
	k.inside = worker + 1
	k.lastHolder = worker + 1
}

// exit records that worker left key's critical section.
func (c *checker) exit(key string, worker int) {
	s := &c.stripes[c.stripe(key)]
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[key]
	if k == nil || k.inside != worker+1 {
		c.violate("key %q: worker %d left a critical section it was not recorded in", key, worker)
		return
	}
	k.inside = 0
}

// workerStats is one worker's tally; only that worker writes it until the
// run ends.
type workerStats struct {
	lat      []time.Duration
	ops      atomic.Int64 // measured ops, read by the progress line
	acquired int64
	errors   atomic.Int64
	firstErr error
}

func runOne(ctx context.Context, sys System, workload string, conc int, opts Options) (Result, error) {
	chk := newChecker()
	workers := make([]Worker, conc)
	defer func() {
		for _, w := range workers {
			if w != nil {
				_ = w.Close()
			}
		}
	}()
	for i := range workers {
		w, err := sys.NewWorker(i)
		if err != nil {
			return Result{}, fmt.Errorf("worker %d: %w", i, err)
		}
		workers[i] = w
	}
	stats := make([]*workerStats, conc)
	for i := range stats {
		stats[i] = &workerStats{}
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			drive(runCtx, w, i, workload, opts, chk, stats[i])
		}()
	}

	label := fmt.Sprintf("[%s %s c=%d]", sys.Name(), workload, conc)
	pids := append([]int{os.Getpid()}, sys.PIDs()...)
	progress := func(phase string, since time.Time) {
		var ops, errs int64
		for _, s := range stats {
			ops += s.ops.Load()
			errs += s.errors.Load()
		}
		el := time.Since(since).Seconds()
		fmt.Fprintf(opts.Progress, "%s %s %4.0fs  ops %d  %.0f ops/s  errors %d  violations %d\n",
			label, phase, el, ops, float64(ops)/el, errs, chk.violations.Load())
	}

	// Warm-up: workers run, nothing is recorded.
	warm := time.Now()
	if err := tick(ctx, opts.Warmup, func() { progress("warm-up", warm) }); err != nil {
		stop()
		wg.Wait()
		return Result{}, err
	}
	cpu0 := cpuSeconds(pids)
	start := time.Now()
	chk.recording.Store(true)
	err := tick(ctx, opts.Duration, func() { progress("run", start) })
	chk.recording.Store(false)
	elapsed := time.Since(start)
	cpu1 := cpuSeconds(pids)
	stop()
	wg.Wait()
	if err != nil {
		return Result{}, err
	}

	r := Result{
		System:      sys.Name(),
		Workload:    workload,
		Concurrency: conc,
		Seconds:     elapsed.Seconds(),
		Handoffs:    chk.handoffs.Load(),
		Violations:  chk.violations.Load(),
		CPUSeconds:  cpu1 - cpu0,
		Fencing:     "n/a",
	}
	var lat []time.Duration
	for _, s := range stats {
		r.Ops += s.ops.Load()
		r.Acquired += s.acquired
		r.Errors += s.errors.Load()
		if s.firstErr != nil && r.FirstError == "" {
			r.FirstError = s.firstErr.Error()
		}
		lat = append(lat, s.lat...)
	}
	if v := chk.firstViol.Load(); v != nil {
		r.FirstViolation = *v
	}
	if chk.sawToken.Load() {
		r.Fencing = "checked"
	}
	r.OpsPerSec = float64(r.Ops) / r.Seconds
	r.HandoffsPerSec = float64(r.Handoffs) / r.Seconds
	q := quantiles(lat, 0.5, 0.99, 0.999, 1)
	r.P50ms, r.P99ms, r.P999ms, r.MaxMs = ms(q[0]), ms(q[1]), ms(q[2]), ms(q[3])
	return r, nil
}

// tick waits d, calling f once a second and at the end.
func tick(ctx context.Context, d time.Duration, f func()) error {
	end := time.NewTimer(d)
	defer end.Stop()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			f()
		case <-end.C:
			return nil
		}
	}
}

// drive is one worker's loop until ctx ends.
func drive(ctx context.Context, w Worker, id int, workload string, opts Options, chk *checker, st *workerStats) {
	rng := rand.New(rand.NewPCG(uint64(id), uint64(time.Now().UnixNano())))
	for ctx.Err() == nil {
		key := hotKey
		if workload == "uncontended" || workload == "hold" {
			key = fmt.Sprintf("bench/k%d", rng.IntN(opts.Keys))
		}
		t0 := time.Now()
		got, err := op(ctx, w, id, key, workload, opts, chk)
		d := time.Since(t0)
		if ctx.Err() != nil {
			return // the run ended under this op: neither counted nor an error
		}
		if !chk.recording.Load() {
			if err != nil {
				pause(ctx, 10*time.Millisecond)
			}
			continue
		}
		if err != nil {
			if st.firstErr == nil {
				st.firstErr = err
			}
			st.errors.Add(1)
			pause(ctx, 10*time.Millisecond) // a failing system must not turn into a busy loop
			continue
		}
		st.lat = append(st.lat, d)
		st.ops.Add(1)
		if got {
			st.acquired++
		}
	}
}

// op runs one lock, critical section and unlock; got says the lock was
// taken (false only for a refused try).
func op(ctx context.Context, w Worker, id int, key, workload string, opts Options, chk *checker) (got bool, err error) {
	octx, cancel := context.WithTimeout(ctx, opts.OpTimeout)
	defer cancel()
	var (
		token    uint64
		hasToken bool
		unlock   func(context.Context) error
	)
	if workload == "try" {
		token, hasToken, unlock, err = w.TryLock(octx, key)
		if errors.Is(err, ErrBusy) {
			return false, nil
		}
	} else {
		token, hasToken, unlock, err = w.Lock(octx, key)
	}
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", key, err)
	}
	if hasToken {
		chk.sawToken.Store(true)
	}
	chk.enter(key, id, token, hasToken)
	if workload == "hold" {
		pause(ctx, opts.Hold)
	}
	chk.exit(key, id)
	// Unlock gets its own bound so that the end of the run does not leave
	// locks held (and waiters of the next run stuck behind them).
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), opts.OpTimeout)
	defer ucancel()
	if err := unlock(uctx); err != nil {
		return true, fmt.Errorf("unlock %s: %w", key, err)
	}
	return true, nil
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
