package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestSmokeLockmesh runs the harness end to end on lockmesh, plain and
// with every metric and trace recorded, for about a second per run, so
// that it cannot rot: every run must make progress and the checker must
// see no violation.
func TestSmokeLockmesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-peer cluster on disk")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var progress bytes.Buffer
	results, err := Run(ctx, Options{
		Systems:     []string{"lockmesh", "lockmesh-traced"},
		Workloads:   []string{"uncontended", "contended"},
		Concurrency: []int{1, 4},
		Duration:    time.Second,
		Warmup:      200 * time.Millisecond,
		Progress:    &progress,
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if len(results) != 8 {
		t.Fatalf("got %d results, want 8", len(results))
	}
	for _, r := range results {
		if r.Ops == 0 || r.Violations != 0 || r.Errors != 0 || r.Fencing != "checked" {
			t.Errorf("%s c=%d: ops %d, errors %d (%s), violations %d (%s), fencing %s",
				r.Workload, r.Concurrency, r.Ops, r.Errors, r.FirstError, r.Violations, r.FirstViolation, r.Fencing)
		}
		if r.Workload == "contended" && r.Concurrency > 1 && r.Handoffs == 0 {
			t.Errorf("contended c=%d: no handoffs between %d workers", r.Concurrency, r.Concurrency)
		}
	}
	var jl, md, svg bytes.Buffer
	if err := WriteJSONL(&jl, results); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSONL(&jl)
	if err != nil || len(back) != len(results) {
		t.Fatalf("JSONL round trip: %d results, %v", len(back), err)
	}
	if err := WriteMarkdown(&md, results); err != nil || !strings.Contains(md.String(), "| uncontended | 4 |") {
		t.Errorf("markdown: %v\n%s", err, md.String())
	}
	if err := WriteSVG(&svg, results); err != nil || !strings.Contains(svg.String(), "<polyline") {
		t.Errorf("svg: %v", err)
	}
}

// TestSmokeLockmeshFamily runs the lock family's workloads on lockmesh for
// about a second each, at a concurrency above the semaphore's permits:
// every run must make progress with no error and no violation, and the
// checker must have seen tokens wherever the workload checks them.
func TestSmokeLockmeshFamily(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-peer cluster on disk")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var progress bytes.Buffer
	family := []string{"rw-read-heavy", "rw-read-heavy-mutex", "semaphore", "lockall", "lockall-seq"}
	results, err := Run(ctx, Options{
		Systems:     []string{"lockmesh"},
		Workloads:   family,
		Concurrency: []int{semPermits + 4},
		Duration:    time.Second,
		Warmup:      200 * time.Millisecond,
		Progress:    &progress,
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if len(results) != len(family) {
		t.Fatalf("got %d results, want %d\n%s", len(results), len(family), progress.String())
	}
	for _, r := range results {
		fencing := "checked"
		if r.Workload == "semaphore" {
			fencing = "n/a" // permit holders' tokens are not ordered among themselves
		}
		if r.Ops == 0 || r.Acquired != r.Ops || r.Violations != 0 || r.Errors != 0 || r.Fencing != fencing {
			t.Errorf("%s c=%d: ops %d, acquired %d, errors %d (%s), violations %d (%s), fencing %s (want %s)",
				r.Workload, r.Concurrency, r.Ops, r.Acquired, r.Errors, r.FirstError, r.Violations, r.FirstViolation, r.Fencing, fencing)
		}
	}
}

// TestRunSkipsMissingLock checks that a system whose workers lack a
// workload's lock is skipped for that workload, with a note, and still
// runs the others.
func TestRunSkipsMissingLock(t *testing.T) {
	Register("mutex-only-test", func(Env) (System, error) { return mutexOnly{}, nil })
	var progress bytes.Buffer
	results, err := Run(context.Background(), Options{
		Systems:     []string{"mutex-only-test"},
		Workloads:   []string{"rw-read-heavy", "semaphore", "lockall"},
		Concurrency: []int{1, 2},
		Progress:    &progress,
	})
	if err != nil || len(results) != 0 {
		t.Fatalf("Run: %d results, %v\n%s", len(results), err, progress.String())
	}
	for _, want := range []string{"rw-read-heavy: bench: system skipped: mutex-only-test has no read/write lock",
		"semaphore: bench: system skipped: mutex-only-test has no semaphore",
		"lockall: bench: system skipped: mutex-only-test has no multi-key lock"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
}

// mutexOnly is a system whose workers have only a mutex, which is never
// taken: the runs it is used for are skipped before any op.
type mutexOnly struct{}

func (mutexOnly) Name() string                  { return "mutex-only-test" }
func (mutexOnly) Start(context.Context) error   { return nil }
func (mutexOnly) NewWorker(int) (Worker, error) { return mutexOnly{}, nil }
func (mutexOnly) Stop() error                   { return nil }
func (mutexOnly) PIDs() []int                   { return nil }
func (mutexOnly) Close() error                  { return nil }
func (mutexOnly) Lock(context.Context, string) (uint64, bool, func(context.Context) error, error) {
	return 0, false, nil, errors.New("not used")
}
func (mutexOnly) TryLock(context.Context, string) (uint64, bool, func(context.Context) error, error) {
	return 0, false, nil, errors.New("not used")
}

// TestCheckerShared makes sure the checker's shared holds (readers,
// permit holders) can fail too: shared holders may overlap each other,
// but not an exclusive holder, not beyond their limit, and a reader's
// token must be above the last writer's.
func TestCheckerShared(t *testing.T) {
	c := newChecker()
	c.enterShared("r", 0, 3, true, 0)
	c.enterShared("r", 1, 2, true, 0) // readers' tokens need not be in entry order
	if got := c.violations.Load(); got != 0 {
		t.Fatalf("two readers flagged: %d violations", got)
	}
	c.enter("r", 2, 9, true) // a writer while readers are inside
	if got := c.violations.Load(); got != 1 {
		t.Fatalf("writer over readers: %d violations, want 1", got)
	}
	c.exit("r", 2)
	c.exitShared("r", 0)
	c.exitShared("r", 1)
	c.enter("r", 2, 3, true) // a writer's token not above an earlier reader's
	if got := c.violations.Load(); got != 2 {
		t.Fatalf("writer token below a reader's: %d violations, want 2", got)
	}
	c.exit("r", 2)
	c.enter("r", 2, 10, true)
	c.exit("r", 2)
	c.enterShared("r", 0, 10, true, 0) // a reader's token not above the last writer's
	if got := c.violations.Load(); got != 3 {
		t.Fatalf("reader token not above the writer's: %d violations, want 3", got)
	}
	c.exitShared("r", 0)
	c.exitShared("r", 0) // leaving twice
	if got := c.violations.Load(); got != 4 {
		t.Fatalf("double shared exit: %d violations, want 4", got)
	}
	c.enterShared("s", 0, 0, false, 2)
	c.enterShared("s", 1, 0, false, 2)
	c.enterShared("s", 2, 0, false, 2) // a third holder of 2 permits
	if got := c.violations.Load(); got != 5 {
		t.Fatalf("over the limit: %d violations, want 5", got)
	}
}

// TestCheckerFlagsViolations makes sure the checker is not a test that
// cannot fail: overlapping holders and tokens that do not grow are counted.
func TestCheckerFlagsViolations(t *testing.T) {
	c := newChecker()
	c.recording.Store(true)
	c.enter("z", 0, 0, true) // a first token may be 0
	c.exit("z", 0)
	if got := c.violations.Load(); got != 0 {
		t.Fatalf("first token 0 flagged: %d violations", got)
	}
	c.enter("k", 0, 5, true)
	c.enter("k", 1, 6, true) // worker 0 is still inside
	if got := c.violations.Load(); got != 1 {
		t.Fatalf("overlap: %d violations, want 1", got)
	}
	c.exit("k", 1)
	c.enter("k", 2, 6, true) // token did not grow
	if got := c.violations.Load(); got != 2 {
		t.Fatalf("stale token: %d violations, want 2", got)
	}
	c.exit("k", 2)
	c.enter("k", 2, 7, true)
	c.exit("k", 2)
	if got := c.violations.Load(); got != 2 {
		t.Fatalf("clean grant flagged: %d violations", got)
	}
	if got := c.handoffs.Load(); got != 2 {
		t.Errorf("handoffs %d, want 2 (0->1, 1->2; 2->2 is none)", got)
	}
	c.enter("j", 3, 0, false)
	c.exit("j", 3)
	c.exit("j", 3) // leaving twice
	if got := c.violations.Load(); got != 3 {
		t.Errorf("double exit: %d violations, want 3", got)
	}
}

func TestQuantiles(t *testing.T) {
	var lat []time.Duration
	for i := 1; i <= 1000; i++ {
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	q := quantiles(lat, 0.5, 0.99, 0.999, 1)
	want := []time.Duration{500, 990, 999, 1000}
	for i := range q {
		if q[i] != want[i]*time.Millisecond {
			t.Errorf("quantile %d = %v, want %v", i, q[i], want[i]*time.Millisecond)
		}
	}
	if q := quantiles(nil, 0.5); q[0] != 0 {
		t.Errorf("empty: %v", q)
	}
}

// TestSmokeLockmesh3Proc runs lockmesh-3proc (3 peer processes, workers on a
// client-only node in the test process) for about a second per run: it
// must build and start the peers, make progress without errors or
// violations, and leave no server process behind.
func TestSmokeLockmesh3Proc(t *testing.T) {
	if testing.Short() {
		t.Skip("builds examples/peer and starts 3 peer processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var progress bytes.Buffer
	var pids []int
	Register("lockmesh-3proc-smoke", func(env Env) (System, error) {
		s, err := newLockmesh3Proc(env)
		if err != nil {
			return nil, err
		}
		return pidRecorder{s, &pids}, nil
	})
	results, err := Run(ctx, Options{
		Systems:     []string{"lockmesh-3proc-smoke"},
		Workloads:   []string{"uncontended", "contended"},
		Concurrency: []int{4},
		Duration:    time.Second,
		Warmup:      200 * time.Millisecond,
		Progress:    &progress,
	})
	if err == nil && len(results) == 0 && strings.Contains(progress.String(), "skipping ") {
		t.Skipf("%s", progress.String()) // no go command or no module source
	}
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if len(results) != 2 {
		t.Fatalf("got %d results, want 2\n%s", len(results), progress.String())
	}
	for _, r := range results {
		if r.Ops == 0 || r.Violations != 0 || r.Errors != 0 || r.Fencing != "checked" {
			t.Errorf("%s c=%d: ops %d, errors %d (%s), violations %d (%s), fencing %s",
				r.Workload, r.Concurrency, r.Ops, r.Errors, r.FirstError, r.Violations, r.FirstViolation, r.Fencing)
		}
	}
	if len(pids) != 3 {
		t.Fatalf("server pids %v, want 3", pids)
	}
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil && runtime.GOOS == "linux" {
			t.Errorf("server process %d still running after Stop", pid)
		}
	}
}

// pidRecorder remembers the server pids a system reported, to check after
// the run that they are gone.
type pidRecorder struct {
	System
	pids *[]int
}

func (p pidRecorder) PIDs() []int {
	pids := p.System.PIDs()
	*p.pids = pids
	return pids
}

// The raft floor proposes on a real 3-replica group and reports what it
// measured.
func TestRaftFloorSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3 NodeHosts")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := MeasureRaftFloor(ctx, t.TempDir(), 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if f.Proposals == 0 || f.P50ms <= 0 || f.P99ms < f.P50ms || f.FloorHandoffsSec <= 0 {
		t.Fatalf("raft floor %+v: want proposals with p50 > 0, p99 >= p50", f)
	}
	var b strings.Builder
	if err := WriteFootprint(&b, Footprint{RaftFloor: &f}); err != nil || !strings.Contains(b.String(), "one replicated commit at a time") {
		t.Fatalf("footprint table without the floor: %q, %v", b.String(), err)
	}
}
