package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestSmokeLockmesh runs the harness end to end on lockmesh for about a
// second per run, so that it cannot rot: every run must make progress and
// the checker must see no violation.
func TestSmokeLockmesh(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-peer cluster on disk")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var progress bytes.Buffer
	results, err := Run(ctx, Options{
		Systems:     []string{"lockmesh"},
		Workloads:   []string{"uncontended", "contended"},
		Concurrency: []int{1, 4},
		Duration:    time.Second,
		Warmup:      200 * time.Millisecond,
		Progress:    &progress,
	})
	if err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if len(results) != 4 {
		t.Fatalf("got %d results, want 4", len(results))
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
