package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
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
//
// The lock family's, each on one key (or one worker's keys) and each held
// briefHold where it says so:
//
//   - rw-read-heavy: every worker takes one read/write lock, for reading
//     in readPercent of its ops and for writing in the rest, and holds it
//     briefHold. Systems with an RWWorker only.
//   - rw-read-heavy-mutex: the same ops on another key, every one of them
//     taking the plain mutex (Lock): the baseline a read/write lock has to
//     beat.
//   - semaphore: every worker acquires 1 of semPermits permits of one key,
//     holds it briefHold and gives it back. Systems with a
//     SemaphoreWorker only.
//   - lockall: every worker takes its own lockAllKeys keys, which share a
//     hash tag ("{w7}/a", "{w7}/b", "{w7}/c"), with one LockAll, and
//     unlocks them. Systems with a MultiWorker only.
//   - lockall-seq: the same keys taken with lockAllKeys Lock calls one
//     after another, and unlocked in reverse order.
var Workloads = []string{"uncontended", "contended", "hold", "try",
	"rw-read-heavy", "rw-read-heavy-mutex", "semaphore", "lockall", "lockall-seq"}

const (
	hotKey     = "bench/hot"
	rwKey      = "bench/rw"
	rwMutexKey = "bench/rw-mutex"
	semKey     = "bench/sem"

	readPercent = 90 // share of rw-read-heavy ops that read
	semPermits  = 8  // the semaphore workload's permits
	lockAllKeys = 3  // keys per lockall op
	// briefHold is how long rw-read-heavy(-mutex) and semaphore ops hold
	// their grant: about one commit, so that holders meet, and short
	// enough that the grants, not the hold, set the pace.
	briefHold = time.Millisecond
)

// supported says whether w can run workload, and if not what it lacks.
func supported(w Worker, workload string) (ok bool, lacks string) {
	switch workload {
	case "rw-read-heavy":
		_, ok = w.(RWWorker)
		return ok, "read/write lock"
	case "semaphore":
		_, ok = w.(SemaphoreWorker)
		return ok, "semaphore"
	case "lockall":
		_, ok = w.(MultiWorker)
		return ok, "multi-key lock"
	}
	return true, ""
}

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
	inside     int         // worker id + 1 inside the critical section alone, 0 if none
	shared     map[int]int // worker id -> holds inside it shared (readers, permit holders)
	nshared    int         // sum of shared
	lastHolder int         // worker id + 1 of the previous holder, 0 if none
	lastToken  uint64      // highest token of any grant that entered
	tokened    bool        // lastToken is set: a first grant may carry token 0 (ZooKeeper's first sequence number)
	exclToken  uint64      // highest token of a grant that entered alone
	exclTokend bool
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

// enter records that worker holds key with token, alone, and flags
// anybody else inside or a token not above every earlier grant's.
func (c *checker) enter(key string, worker int, token uint64, hasToken bool) {
	c.enterAs(key, worker, token, hasToken, false, 0)
}

// enterShared records that worker holds key with token together with
// others (a reader, a permit holder), and flags a holder inside alone,
// more than limit shared holders (limit 0: any number), or a token not
// above the last alone holder's.
func (c *checker) enterShared(key string, worker int, token uint64, hasToken bool, limit int) {
	c.enterAs(key, worker, token, hasToken, true, limit)
}

func (c *checker) enterAs(key string, worker int, token uint64, hasToken, shared bool, limit int) {
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
	switch {
	case !shared && k.nshared > 0:
		c.violate("key %q: worker %d entered alone while %d shared holders are inside", key, worker, k.nshared)
	case shared && limit > 0 && k.nshared >= limit:
		c.violate("key %q: worker %d entered as shared holder %d of at most %d", key, worker, k.nshared+1, limit)
	}
	if hasToken {
		switch {
		case !shared && k.tokened && token <= k.lastToken:
			c.violate("key %q: worker %d got token %d, not above the previous grant's %d", key, worker, token, k.lastToken)
		case shared && k.exclTokend && token <= k.exclToken:
			c.violate("key %q: worker %d got shared token %d, not above the last exclusive grant's %d", key, worker, token, k.exclToken)
		}
		k.lastToken = max(k.lastToken, token)
		k.tokened = true
		if !shared {
			k.exclToken, k.exclTokend = token, true
		}
	}
	if k.lastHolder != 0 && k.lastHolder != worker+1 && c.recording.Load() {
		c.handoffs.Add(1)
	}
	k.lastHolder = worker + 1
	if shared {
		if k.shared == nil {
			k.shared = map[int]int{}
		}
		k.shared[worker]++
		k.nshared++
	} else {
		k.inside = worker + 1
	}
}

// exit records that worker left key's critical section it held alone.
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

// exitShared records that worker left key's critical section it held
// shared.
func (c *checker) exitShared(key string, worker int) {
	s := &c.stripes[c.stripe(key)]
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[key]
	if k == nil || k.shared[worker] == 0 {
		c.violate("key %q: worker %d left a shared critical section it was not recorded in", key, worker)
		return
	}
	k.shared[worker]--
	k.nshared--
}

// workerStats is one worker's tally; only that worker writes it until the
// run ends.
type workerStats struct {
	lat      []time.Duration
	grantLat []time.Duration // of acquired ops only
	ops      atomic.Int64    // measured ops, read by the progress line
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
		if ok, lacks := supported(w, workload); !ok {
			return Result{}, fmt.Errorf("%w: %s has no %s", ErrSkip, sys.Name(), lacks)
		}
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
	flush0, flushOK := diskFlushes(os.TempDir())
	ent0, cmd0, counted := raftCounts(sys)
	start := time.Now()
	chk.recording.Store(true)
	err := tick(ctx, opts.Duration, func() { progress("run", start) })
	chk.recording.Store(false)
	elapsed := time.Since(start)
	cpu1 := cpuSeconds(pids)
	flush1, _ := diskFlushes(os.TempDir())
	ent1, cmd1, _ := raftCounts(sys)
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
	var lat, grantLat []time.Duration
	for _, s := range stats {
		r.Ops += s.ops.Load()
		r.Acquired += s.acquired
		r.Errors += s.errors.Load()
		if s.firstErr != nil && r.FirstError == "" {
			r.FirstError = s.firstErr.Error()
		}
		lat = append(lat, s.lat...)
		grantLat = append(grantLat, s.grantLat...)
	}
	if v := chk.firstViol.Load(); v != nil {
		r.FirstViolation = *v
	}
	if chk.sawToken.Load() {
		r.Fencing = "checked"
	}
	r.OpsPerSec = float64(r.Ops) / r.Seconds
	if r.Ops > 0 {
		r.CPUMicrosPerOp = r.CPUSeconds * 1e6 / float64(r.Ops)
		if flushOK {
			v := float64(flush1-flush0) / float64(r.Ops)
			r.FlushesPerOp = &v
		}
	}
	if counted && ent1 > ent0 {
		v := float64(cmd1-cmd0) / float64(ent1-ent0)
		r.CommandsPerEntry = &v
	}
	r.HandoffsPerSec = float64(r.Handoffs) / r.Seconds
	q := quantiles(lat, 0.5, 0.99, 0.999, 1)
	r.P50ms, r.P99ms, r.P999ms, r.MaxMs = ms(q[0]), ms(q[1]), ms(q[2]), ms(q[3])
	q = quantiles(grantLat, 0.5, 0.99)
	r.GrantP50ms, r.GrantP99ms = ms(q[0]), ms(q[1])
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
		switch workload {
		case "uncontended", "hold":
			key = fmt.Sprintf("bench/k%d", rng.IntN(opts.Keys))
		case "rw-read-heavy":
			key = rwKey
		case "rw-read-heavy-mutex":
			key = rwMutexKey
		case "semaphore":
			key = semKey
		}
		read := rng.IntN(100) < readPercent
		t0 := time.Now()
		got, grantLat, err := op(ctx, w, id, key, read, workload, opts, chk)
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
			st.grantLat = append(st.grantLat, grantLat)
		}
	}
}

// grant is what one op's lock call holds: its keys, each with its token
// when the system has them, whether they are held shared (a read lock,
// semaphore permits) and with how many others at most, and how to give
// them all back.
type grant struct {
	keys     []string
	tokens   []uint64
	hasToken bool
	shared   bool
	limit    int // with shared: most holders at once, 0 for any number
	unlock   func(context.Context) error
}

// op runs one lock, critical section and unlock; got says the lock was
// taken (false only for a refused try), grantLat how long taking it took.
// read says whether an rw-read-heavy op reads.
func op(ctx context.Context, w Worker, id int, key string, read bool, workload string, opts Options, chk *checker) (got bool, grantLat time.Duration, err error) {
	octx, cancel := context.WithTimeout(ctx, opts.OpTimeout)
	defer cancel()
	t0 := time.Now()
	g, err := take(octx, w, id, key, read, workload)
	grantLat = time.Since(t0)
	if workload == "try" && errors.Is(err, ErrBusy) {
		return false, grantLat, nil
	}
	if err != nil {
		return false, grantLat, fmt.Errorf("lock %s: %w", strings.Join(g.keys, ","), err)
	}
	if g.hasToken {
		chk.sawToken.Store(true)
	}
	for i, k := range g.keys {
		var token uint64
		if g.hasToken {
			token = g.tokens[i]
		}
		if g.shared {
			chk.enterShared(k, id, token, g.hasToken, g.limit)
		} else {
			chk.enter(k, id, token, g.hasToken)
		}
	}
	switch workload {
	case "hold":
		pause(ctx, opts.Hold)
	case "rw-read-heavy", "rw-read-heavy-mutex", "semaphore":
		pause(ctx, briefHold)
	}
	for _, k := range slices.Backward(g.keys) {
		if g.shared {
			chk.exitShared(k, id)
		} else {
			chk.exit(k, id)
		}
	}
	// Unlock gets its own bound so that the end of the run does not leave
	// locks held (and waiters of the next run stuck behind them).
	uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), opts.OpTimeout)
	defer ucancel()
	if err := g.unlock(uctx); err != nil {
		return true, grantLat, fmt.Errorf("unlock %s: %w", strings.Join(g.keys, ","), err)
	}
	return true, grantLat, nil
}

// take makes the lock call of one op of workload on key (lockall,
// lockall-seq: on worker id's own keys). On error, g.keys still names
// the keys.
func take(ctx context.Context, w Worker, id int, key string, read bool, workload string) (g grant, err error) {
	g = grant{keys: []string{key}, tokens: make([]uint64, 1)}
	switch workload {
	case "try":
		g.tokens[0], g.hasToken, g.unlock, err = w.TryLock(ctx, key)
	case "rw-read-heavy":
		rw := w.(RWWorker)
		if read {
			g.shared = true
			g.tokens[0], g.hasToken, g.unlock, err = rw.RLock(ctx, key)
		} else {
			g.tokens[0], g.hasToken, g.unlock, err = rw.WLock(ctx, key)
		}
	case "semaphore":
		g.shared, g.limit = true, semPermits
		g.unlock, err = w.(SemaphoreWorker).Acquire(ctx, key, semPermits, 1)
	case "lockall":
		g.keys = workerKeys(id)
		g.tokens, g.hasToken, g.unlock, err = w.(MultiWorker).LockAll(ctx, g.keys)
	case "lockall-seq":
		g.keys = workerKeys(id)
		g.tokens, g.hasToken, g.unlock, err = lockSeq(ctx, w, g.keys)
	default:
		g.tokens[0], g.hasToken, g.unlock, err = w.Lock(ctx, key)
	}
	return g, err
}

// workerKeys are worker id's lockall keys: lockAllKeys keys with one hash
// tag, so that lockmesh keeps them on one shard.
func workerKeys(id int) []string {
	keys := make([]string, lockAllKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("{w%d}/%c", id, 'a'+i)
	}
	return keys
}

// lockSeq takes keys with w.Lock one after another and returns an unlock
// that releases them in reverse order, each waiting for the one before.
// If a Lock fails, the keys taken so far are unlocked.
func lockSeq(ctx context.Context, w Worker, keys []string) (tokens []uint64, hasToken bool, unlock func(context.Context) error, err error) {
	var unlocks []func(context.Context) error
	unlock = func(ctx context.Context) error {
		var errs []error
		for _, u := range slices.Backward(unlocks) {
			errs = append(errs, u(ctx))
		}
		return errors.Join(errs...)
	}
	for _, k := range keys {
		t, ht, u, err := w.Lock(ctx, k)
		if err != nil {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			_ = unlock(uctx)
			return nil, false, nil, err
		}
		tokens, hasToken = append(tokens, t), ht
		unlocks = append(unlocks, u)
	}
	return tokens, hasToken, unlock, nil
}

func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// raftCounts reads sys's entry and command counters, if it has them.
func raftCounts(sys System) (entries, commands uint64, ok bool) {
	c, ok := sys.(EntryCounter)
	if !ok {
		return 0, 0, false
	}
	entries, commands = c.RaftCounts()
	return entries, commands, true
}
