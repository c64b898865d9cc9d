package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	_ "net/http/pprof" // for -pprof
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Main is the lockbench command: it parses args, runs the benchmarks,
// writes the results and returns the exit code (0 ok, 1 failed, 2 bad
// flags). bench/cmd/lockbench and bench/compare call it; the latter after
// registering its systems. SIGINT and SIGTERM stop the run and every
// server it started.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("lockbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		systems   = fs.String("systems", "lockmesh", "comma-separated systems to run (registered: "+strings.Join(Systems(), ",")+")")
		workloads = fs.String("workloads", "uncontended,contended", "comma-separated workloads: "+strings.Join(Workloads, ","))
		concs     = fs.String("c", "1,16,64", "comma-separated concurrencies (workers)")
		dur       = fs.Duration("d", 10*time.Second, "measured time per run")
		warmup    = fs.Duration("warmup", time.Second, "unmeasured time before each run")
		hold      = fs.Duration("hold", 10*time.Millisecond, "how long the hold workload holds each lock")
		keys      = fs.Int("keys", 100_000, "key space of the uncontended and hold workloads")
		shards    = fs.Int("shards", 0, "lock shards of the lockmesh clusters the bench creates (0: node's default)")
		out       = fs.String("out", "", "directory for results.jsonl, results.md, throughput.svg (and footprint.json); empty writes none")
		footprint = fs.Bool("footprint", false, "also measure lockmesh's start-up time, idle CPU and memory per held lock")
		floor     = fs.Duration("floor", 0, "also measure, for this long, one replicated commit at a time on a bare 3-replica Raft group (the floor of hand-offs on a hot key); 0 skips")
		startups  = fs.Int("startups", 3, "with -footprint: start-ups to time")
		idle      = fs.Duration("idle", 30*time.Second, "with -footprint: idle CPU window (0 skips)")
		memLocks  = fs.String("memlocks", "100000", "with -footprint: comma-separated held-lock counts (empty skips)")
		memTime   = fs.Duration("memtimeout", 5*time.Minute, "with -footprint: bound on taking one count's locks")
		heapProfs = fs.String("heapprofiles", "", "with -footprint: write each lockmesh-3proc server's heap profile, holding the locks, into this directory")
		cpuprof   = fs.String("cpuprofile", "", "write a CPU profile of the whole run (bench process) to this file")
		pprofAddr = fs.String("pprof", "", "serve net/http/pprof on this 127.0.0.1 address during the run, e.g. 127.0.0.1:6060")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	cs, err := parseInts(*concs)
	if err != nil {
		fmt.Fprintf(stderr, "lockbench: -c: %v\n", err)
		return 2
	}
	locks, err := parseInts(*memLocks)
	if err != nil {
		fmt.Fprintf(stderr, "lockbench: -memlocks: %v\n", err)
		return 2
	}
	opts := Options{
		Systems:     splitList(*systems),
		Workloads:   splitList(*workloads),
		Concurrency: cs,
		Duration:    *dur,
		Warmup:      *warmup,
		Hold:        *hold,
		Keys:        *keys,
		Shards:      *shards,
		Progress:    stdout,
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer StopAllProcs()

	if *pprofAddr != "" {
		host, _, err := net.SplitHostPort(*pprofAddr)
		if err != nil || host != "127.0.0.1" {
			fmt.Fprintf(stderr, "lockbench: -pprof %q must be 127.0.0.1:PORT\n", *pprofAddr)
			return 2
		}
		srv := &http.Server{Addr: *pprofAddr} // DefaultServeMux carries net/http/pprof
		go func() { _ = srv.ListenAndServe() }()
		defer srv.Close()
	}
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			fmt.Fprintf(stderr, "lockbench: %v\n", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "lockbench: %v\n", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}

	results, runErr := Run(ctx, opts)
	if runErr != nil {
		fmt.Fprintf(stderr, "lockbench: %v\n", runErr)
	}
	var fp *Footprint
	if *footprint && runErr == nil {
		f, err := MeasureFootprint(ctx, FootprintOptions{
			Startups: *startups, Idle: *idle, Locks: locks, LockTimeout: *memTime, HeapProfiles: *heapProfs, Progress: stdout,
		})
		fp = &f
		if err != nil {
			fmt.Fprintf(stderr, "lockbench: footprint: %v\n", err)
			runErr = err
		}
	}
	if *floor > 0 && runErr == nil {
		if fp == nil {
			fp = &Footprint{}
		}
		f, err := measureFloor(ctx, *floor)
		if err != nil {
			fmt.Fprintf(stderr, "lockbench: %v\n", err)
			runErr = err
		} else {
			fp.RaftFloor = &f
			fmt.Fprintf(stdout, "raft floor: %.0f commits/s one at a time, p50 %.2f ms, p99 %.2f ms\n", f.ProposalsPerSec, f.P50ms, f.P99ms)
		}
	}

	if len(results) > 0 {
		fmt.Fprintln(stdout)
		_ = WriteMarkdown(stdout, results)
	}
	if fp != nil {
		fmt.Fprintln(stdout)
		_ = WriteFootprint(stdout, *fp)
	}
	if *out != "" {
		if err := writeOut(*out, results, fp); err != nil {
			fmt.Fprintf(stderr, "lockbench: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "\nwrote %s\n", *out)
	}
	var viol int64
	for _, r := range results {
		viol += r.Violations
	}
	if viol > 0 {
		fmt.Fprintf(stderr, "lockbench: %d safety violations; see first_violation in the results\n", viol)
		return 1
	}
	if runErr != nil {
		return 1
	}
	return 0
}

func writeOut(dir string, results []Result, fp *Footprint) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	write := func(name string, f func(io.Writer) error) error {
		file, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if err := f(file); err != nil {
			file.Close()
			return err
		}
		return file.Close()
	}
	if len(results) > 0 {
		if err := write("results.jsonl", func(w io.Writer) error { return WriteJSONL(w, results) }); err != nil {
			return err
		}
		if err := write("results.md", func(w io.Writer) error { return WriteMarkdown(w, results) }); err != nil {
			return err
		}
		if err := write("throughput.svg", func(w io.Writer) error { return WriteSVG(w, results) }); err != nil {
			return err
		}
	}
	if fp != nil {
		if err := write("footprint.json", func(w io.Writer) error {
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			return enc.Encode(fp)
		}); err != nil {
			return err
		}
		if err := write("footprint.md", func(w io.Writer) error { return WriteFootprint(w, *fp) }); err != nil {
			return err
		}
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range splitList(s) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}
