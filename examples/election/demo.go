package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The demo: children of this program on loopback, driven by their stdout
// lines.

// peerNames are the demo's candidates; observerName is its observer.
var peerNames = []string{"p1", "p2", "p3"}

const observerName = "observer"

// stopGrace is how long the children get to exit after SIGTERM before
// they are killed.
const stopGrace = 5 * time.Second

// runDemo runs the scenario once with every child's lines shown, or
// cfg.measure times with a line per round and the times at the end.
func runDemo(ctx context.Context, bin string, cfg config, out io.Writer) error {
	dir, err := os.MkdirTemp("", "lockmesh-election-")
	if err != nil {
		return err
	}
	if cfg.keep {
		defer fmt.Fprintf(out, "data dirs and logs (NAME.log) kept in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	opts := roundOptions{bin: bin, ttl: cfg.node.SessionTTL, rtt: cfg.node.RTT, election: cfg.election}
	if cfg.measure == 0 {
		opts.dir, opts.echo = dir, out
		rctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		defer cancel()
		r, err := runRound(rctx, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\nresignation: %s was elected %v after %s resigned\n", r.leaders[1], r.handover.Round(time.Millisecond), r.leaders[0])
		fmt.Fprintf(out, "crash:       %s was elected %v after %s was killed (session TTL %v)\n", r.leaders[2], r.failover.Round(time.Millisecond), r.leaders[1], opts.ttl)
		fmt.Fprintln(out, "every child stopped")
		return nil
	}
	rounds, err := measure(ctx, opts, dir, cfg.measure, cfg.timeout, out)
	if err != nil {
		return err
	}
	var failover, handover []time.Duration
	for _, r := range rounds {
		failover = append(failover, r.failover)
		handover = append(handover, r.handover)
	}
	fmt.Fprintf(out, "\nfailover after SIGKILL of the leader, %d rounds at session TTL %v, RTT %v (kill -> the observer's line of the new leader):\n", len(rounds), opts.ttl, opts.rtt)
	fmt.Fprintf(out, "  median %v, worst %v, best %v\n", median(failover).Round(time.Millisecond), slices.Max(failover).Round(time.Millisecond), slices.Min(failover).Round(time.Millisecond))
	fmt.Fprintf(out, "hand-over by resignation (SIGUSR1 -> the observer's line of the next leader):\n")
	fmt.Fprintf(out, "  median %v, worst %v, best %v\n", median(handover).Round(time.Millisecond), slices.Max(handover).Round(time.Millisecond), slices.Min(handover).Round(time.Millisecond))
	return nil
}

// measure runs the scenario n times, each on a fresh cluster under dir
// and bounded by timeout, prints a line per round, and returns them.
func measure(ctx context.Context, opts roundOptions, dir string, n int, timeout time.Duration, out io.Writer) ([]*round, error) {
	var rounds []*round
	for i := 1; i <= n; i++ {
		opts.dir = filepath.Join(dir, fmt.Sprintf("round-%d", i))
		rctx, cancel := context.WithTimeout(ctx, timeout)
		r, err := runRound(rctx, opts)
		cancel()
		if err != nil {
			return rounds, fmt.Errorf("round %d: %w", i, err)
		}
		rounds = append(rounds, r)
		fmt.Fprintf(out, "round %d/%d: failover %v (%s killed, %s elected, term %d -> %d); resignation %v\n", i, n,
			r.failover.Round(time.Millisecond), r.leaders[1], r.leaders[2], r.terms[1], r.terms[2], r.handover.Round(time.Millisecond))
	}
	return rounds, nil
}

// median returns the median of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// roundOptions configure one round of the scenario.
type roundOptions struct {
	bin      string // the program, run as the children
	dir      string // their data dirs go under it
	ttl, rtt time.Duration
	election string
	// echo gets the narration and every child's line but the leading
	// ones; nil for none.
	echo io.Writer
}

// round is what one round saw.
type round struct {
	// leaders are the first leader (who resigns), the second (who is
	// killed) and the third, and terms their terms.
	leaders [3]string
	terms   [3]uint64
	// handover is from SIGUSR1 to the first leader until the observer's
	// line of the second; failover from SIGKILL of the second until the
	// observer's line of the third (the observer's at= times).
	handover, failover time.Duration
	// asked is when the first leader was sent SIGUSR1, killed when the
	// second was sent SIGKILL, stopped when the children were told to
	// stop.
	asked, killed, stopped time.Time
	// events are every line the children printed, in the order the demo
	// read them, and pids the children's process ids.
	events []event
	pids   map[string]int
}

// runRound starts three peers and an observer, has the first leader
// resign and the second crash, and stops every child. It returns what it
// saw, also when it fails (with the error).
func runRound(ctx context.Context, o roundOptions) (r *round, err error) {
	f := newFleet(o)
	r = &round{}
	defer func() {
		if r.stopped.IsZero() {
			r.stopped = time.Now()
		}
		r.events, r.pids, err = f.finish(ctx, err)
	}()
	if err := f.launch(ctx, o, "-report-leading", "100ms"); err != nil {
		return r, err
	}

	// 1. A leader, with the two other candidates queued behind it.
	first, err := f.awaitLeader(ctx, "a first leader", 0, "")
	if err != nil {
		return r, err
	}
	r.leaders[0], r.terms[0] = first.value, first.term
	if err := f.until(ctx, "the other candidates queued behind "+first.value, func() bool {
		return f.queuedSince(0, first.value) >= len(peerNames)-1
	}); err != nil {
		return r, err
	}

	// 2. It resigns: the head of the queue is elected in the same entry.
	resigner, err := f.kid(first.value)
	if err != nil {
		return r, err
	}
	f.say("SIGUSR1 to %s, the leader: it resigns, and the head of the queue is elected in the same Raft entry", first.value)
	queuedBefore := len(f.queued)
	r.asked = time.Now()
	if err := resigner.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		return r, err
	}
	second, err := f.awaitLeader(ctx, "a leader after "+first.value+" resigned", first.term, "")
	if err != nil {
		return r, err
	}
	r.leaders[1], r.terms[1] = second.value, second.term
	r.handover = second.at.Sub(r.asked)
	f.say("%s leads %v after the signal (the observer's line), term %d -> %d", second.value, r.handover.Round(time.Millisecond), first.term, second.term)
	// The resigned leader campaigns again, at the back of the queue.
	if err := f.until(ctx, first.value+" queued again", func() bool {
		return f.queuedSince(queuedBefore, "") > f.queuedSince(queuedBefore, first.value)
	}); err != nil {
		return r, err
	}

	// 3. It crashes: the next is elected once its session's TTL ran out.
	victim, err := f.kid(second.value)
	if err != nil {
		return r, err
	}
	f.say("SIGKILL to %s (pid %d), the leader: its session ends when the cluster stops hearing from it for the TTL", victim.name, victim.cmd.Process.Pid)
	r.killed = time.Now()
	if err := f.kill(victim); err != nil {
		return r, err
	}
	third, err := f.awaitLeader(ctx, "a leader after "+victim.name+" was killed", second.term, victim.name)
	if err != nil {
		return r, err
	}
	r.leaders[2], r.terms[2] = third.value, third.term
	r.failover = third.at.Sub(r.killed)
	f.say("%s leads %v after the kill (the observer's line), term %d -> %d", third.value, r.failover.Round(time.Millisecond), second.term, third.term)

	r.stopped = time.Now()
	f.say("stopping the children: SIGTERM, and SIGKILL to any still running after %v", stopGrace)
	return r, nil
}

// newFleet returns a fleet that runs o's program, with nothing started.
func newFleet(o roundOptions) *fleet {
	return &fleet{bin: o.bin, dir: o.dir, echo: o.echo, start: time.Now(), lines: make(chan line, 4096),
		reserved: map[string][]func() error{}, elected: map[uint64]event{}}
}

// launch starts three peers, with peerArgs added to their flags, and an
// observer, on free loopback ports, and waits until every one is ready.
func (f *fleet) launch(ctx context.Context, o roundOptions, peerArgs ...string) error {
	f.say("starting 3 peers and an observer on 127.0.0.1: session TTL %v, RTT %v, election %q, data in %s", o.ttl, o.rtt, o.election, o.dir)
	names := append(slices.Clone(peerNames), observerName)
	addrs, err := f.reserve(3 * len(names))
	if err != nil {
		return err
	}
	args := map[string][]string{}
	gossip := map[string]string{}
	for i, name := range names {
		gossip[name] = addrs[3*i]
		args[name] = []string{"-name", name, "-data", filepath.Join(o.dir, name),
			"-gossip", addrs[3*i], "-raft", addrs[3*i+1], "-rpc", addrs[3*i+2],
			"-ttl", o.ttl.String(), "-rtt", o.rtt.String(), "-election", o.election, "-log-level", "info"}
	}
	joinAllBut := func(self string) string {
		var j []string
		for _, p := range peerNames {
			if p != self {
				j = append(j, gossip[p])
			}
		}
		return strings.Join(j, ",")
	}
	// Every peer's ports are free before the first starts and joins the
	// others.
	f.release(addrs...)
	for _, p := range peerNames {
		a := append(args[p], "-role", "peer", "-expect", strconv.Itoa(len(peerNames)), "-join", joinAllBut(p))
		if err := f.startKid(p, append(a, peerArgs...)...); err != nil {
			return err
		}
	}
	if err := f.startKid(observerName, append(args[observerName], "-role", "observer", "-join", joinAllBut(""))...); err != nil {
		return err
	}
	ready := map[string]bool{}
	_, err = f.await(ctx, "every child ready", func(e event) bool {
		if e.kind == "ready" {
			ready[e.from] = true
		}
		return len(ready) == len(names)
	})
	return err
}

// finish stops every child (stopAll) and returns every line read and the
// children's pids, with err, or stopAll's error if err is nil; a failure
// other than an interruption gets the children's last stderr lines.
func (f *fleet) finish(ctx context.Context, err error) ([]event, map[string]int, error) {
	if serr := f.stopAll(); err == nil {
		err = serr
	}
	pids := map[string]int{}
	for _, k := range f.kids {
		pids[k.name] = k.cmd.Process.Pid
	}
	if err != nil && !errors.Is(ctx.Err(), context.Canceled) {
		// Failed, or out of time, rather than interrupted: the
		// children's last words say why.
		err = fmt.Errorf("%w%s", err, f.tails(20))
	}
	return f.events, pids, err
}

// fleet runs children of the program and reads their stdout lines.
type fleet struct {
	bin   string
	dir   string // the children's data dirs and logs go under it
	echo  io.Writer
	start time.Time
	lines chan line

	mu       sync.Mutex
	kids     []*kid
	reserved map[string][]func() error // loopback ports held until a child gets them

	// What the lines said: every one in order, the peers' elected lines
	// by term, the observer's leader and vacant lines, and the queued
	// lines.
	events   []event
	elected  map[uint64]event
	observed []event
	queued   []event
}

// kid is a child process.
type kid struct {
	name     string
	cmd      *exec.Cmd
	stderr   *tailBuffer
	exited   chan struct{} // closed once the process was waited for
	stopping bool          // the fleet killed or stopped it: its exit is expected
}

// line is a line a child printed, or, with exit set, its exit.
type line struct {
	kid  *kid
	text string
	at   time.Time // when the demo read it
	exit bool
}

// event is a parsed line.
type event struct {
	from   string // the child's name
	text   string
	kind   string // the line's first word (after resync)
	resync bool
	term   uint64
	index  uint64
	peer   string
	value  string
	place  int
	shard  uint64
	// at is the child's at= time, or when the demo read the line.
	at time.Time
}

var atField = regexp.MustCompile(` at=\d+`)

// parse turns a child's line into an event.
func parse(from, text string, read time.Time) event {
	e := event{from: from, text: text, at: read}
	rest := text
	if r, ok := strings.CutPrefix(rest, "resync "); ok {
		e.resync, rest = true, r
	}
	e.kind, rest, _ = strings.Cut(rest, " ")
	for rest != "" {
		var f string
		if strings.HasPrefix(rest, "err=") {
			break // the rest of the line
		}
		f, rest, _ = strings.Cut(rest, " ")
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "term":
			e.term, _ = strconv.ParseUint(v, 10, 64)
		case "index":
			e.index, _ = strconv.ParseUint(v, 10, 64)
		case "peer":
			e.peer = v
		case "value":
			e.value = v
		case "place":
			e.place, _ = strconv.Atoi(v)
		case "shard":
			e.shard, _ = strconv.ParseUint(v, 10, 64)
		case "at":
			if ns, err := strconv.ParseInt(v, 10, 64); err == nil {
				e.at = time.Unix(0, ns)
			}
		}
	}
	return e
}

// say prints a line of the demo's own.
func (f *fleet) say(format string, args ...any) {
	if f.echo != nil {
		fmt.Fprintf(f.echo, "%8.3fs  %-8s  %s\n", time.Since(f.start).Seconds(), "demo", fmt.Sprintf(format, args...))
	}
}

// startKid starts the program with args as the child name.
func (f *fleet) startKid(name string, args ...string) error {
	f.release(args...)
	k := &kid{name: name, cmd: exec.Command(f.bin, args...), stderr: &tailBuffer{max: 64 << 10}, exited: make(chan struct{})}
	// Its logs go to DIR/NAME.log too, next to its data dir.
	if err := os.MkdirAll(f.dir, 0o755); err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(f.dir, name+".log"))
	if err != nil {
		return err
	}
	k.cmd.Stderr = io.MultiWriter(k.stderr, logFile)
	k.cmd.SysProcAttr = procAttr()
	stdout, err := k.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := k.cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	f.mu.Lock()
	f.kids = append(f.kids, k)
	f.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f.lines <- line{kid: k, text: sc.Text(), at: time.Now()}
		}
		err := k.cmd.Wait() // after the reads, as StdoutPipe requires
		logFile.Close()
		close(k.exited)
		f.lines <- line{kid: k, text: fmt.Sprintf("exited: %v", cmpErr(err)), at: time.Now(), exit: true}
	}()
	return nil
}

func cmpErr(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// kid returns the child called name.
func (f *fleet) kid(name string) (*kid, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range f.kids {
		if k.name == name {
			return k, nil
		}
	}
	return nil, fmt.Errorf("no child called %q", name)
}

// note records a line read, echoes it, and returns its event.
func (f *fleet) note(l line) event {
	e := parse(l.kid.name, l.text, l.at)
	if l.exit {
		e.kind = "exited"
	}
	f.events = append(f.events, e)
	switch {
	case e.kind == "elected":
		f.elected[e.term] = e
	case e.kind == "queued":
		f.queued = append(f.queued, e)
	case l.kid.name == observerName && (e.kind == "leader" || e.kind == "vacant"):
		f.observed = append(f.observed, e)
	}
	if f.echo != nil && e.kind != "leading" {
		fmt.Fprintf(f.echo, "%8.3fs  %-8s  %s\n", l.at.Sub(f.start).Seconds(), l.kid.name, atField.ReplaceAllString(l.text, ""))
	}
	return e
}

// await reads lines until done, given each event, returns true, ctx
// ends, or a child exits that was not stopped by the fleet.
func (f *fleet) await(ctx context.Context, what string, done func(event) bool) (event, error) {
	for {
		select {
		case l := <-f.lines:
			e := f.note(l)
			if l.exit && !f.expected(l.kid) && ctx.Err() == nil {
				return e, fmt.Errorf("waiting for %s: %s %s", what, l.kid.name, l.text)
			}
			if done(e) {
				return e, nil
			}
		case <-ctx.Done():
			return event{}, fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		}
	}
}

func (f *fleet) expected(k *kid) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return k.stopping
}

// awaitLeader waits until the observer shows a leader of a term above
// after, other than not, and until that leader printed its elected line.
// It returns the observer's event.
func (f *fleet) awaitLeader(ctx context.Context, what string, after uint64, not string) (event, error) {
	found := func() (event, bool) {
		for i := len(f.observed) - 1; i >= 0; i-- {
			if e := f.observed[i]; e.kind == "leader" && e.term > after && e.value != not {
				_, ok := f.elected[e.term]
				return e, ok
			}
		}
		return event{}, false
	}
	if e, ok := found(); ok {
		return e, nil
	}
	if _, err := f.await(ctx, what, func(event) bool { _, ok := found(); return ok }); err != nil {
		return event{}, err
	}
	e, _ := found()
	return e, nil
}

// until reads lines until cond holds, or fails as await does.
func (f *fleet) until(ctx context.Context, what string, cond func() bool) error {
	if cond() {
		return nil
	}
	_, err := f.await(ctx, what, func(event) bool { return cond() })
	return err
}

// queuedSince counts the queued lines from index i of f.queued on, by
// peers other than not.
func (f *fleet) queuedSince(i int, not string) int {
	n := 0
	for _, q := range f.queued[i:] {
		if q.from != not {
			n++
		}
	}
	return n
}

// kill sends SIGKILL to k and waits until it is gone.
func (f *fleet) kill(k *kid) error {
	f.mu.Lock()
	k.stopping = true
	f.mu.Unlock()
	if err := k.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("kill %s: %w", k.name, err)
	}
	select {
	case <-k.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 10s after SIGKILL", k.name, k.cmd.Process.Pid)
	}
}

// stopAll stops every child still running, by its pid: SIGTERM, and
// SIGKILL after stopGrace. It reads their lines meanwhile, and releases
// the ports still reserved.
func (f *fleet) stopAll() error {
	f.mu.Lock()
	kids := slices.Clone(f.kids)
	for a := range f.reserved {
		f.unreserve(a)
	}
	for _, k := range kids {
		k.stopping = true
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
		// A child left stopped (SIGSTOP, by a test that failed before it
		// resumed the child) would not see SIGTERM before SIGKILL.
		_ = k.cmd.Process.Signal(syscall.SIGCONT)
	}
	f.mu.Unlock()
	grace := time.After(stopGrace)
	hard := time.After(stopGrace + 10*time.Second)
	var stuck []string
wait:
	for _, k := range kids {
		for {
			select {
			case <-k.exited:
				continue wait
			case l := <-f.lines:
				f.note(l)
			case <-grace:
				grace = nil
				for _, k := range kids {
					_ = k.cmd.Process.Kill() // an error for one that exited
				}
			case <-hard:
				for _, k := range kids {
					select {
					case <-k.exited:
					default:
						stuck = append(stuck, fmt.Sprintf("%s (pid %d)", k.name, k.cmd.Process.Pid))
					}
				}
				break wait
			}
		}
	}
	// The exit lines left.
	for {
		select {
		case l := <-f.lines:
			f.note(l)
			continue
		default:
		}
		break
	}
	if len(stuck) > 0 {
		return fmt.Errorf("still running after SIGKILL: %s", strings.Join(stuck, ", "))
	}
	return nil
}

// tails returns the last n stderr lines of every child.
func (f *fleet) tails(n int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, k := range f.kids {
		fmt.Fprintf(&b, "\n--- stderr of %s, last lines:\n%s", k.name, k.stderr.tail(n))
	}
	return b.String()
}

// reserve returns n free loopback addresses, TCP and UDP free on each
// port (memberlist uses both), and keeps them bound until release: a
// port closed at once could be taken meanwhile by any socket on the
// machine, such as the running children's outgoing connections.
func (f *fleet) reserve(n int) ([]string, error) {
	var addrs []string
	var skipped []net.Listener // held until the end, so no port comes twice
	defer func() {
		for _, l := range skipped {
			_ = l.Close()
		}
	}()
	for len(addrs) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		u, err := net.ListenPacket("udp", l.Addr().String())
		if err != nil {
			skipped = append(skipped, l)
			continue // UDP side taken: try another port
		}
		a := l.Addr().String()
		f.mu.Lock()
		f.reserved[a] = []func() error{l.Close, u.Close}
		f.mu.Unlock()
		addrs = append(addrs, a)
	}
	return addrs, nil
}

// release closes the reservations of the addresses among args.
func (f *fleet) release(args ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range args {
		f.unreserve(a)
	}
}

// unreserve closes addr's reservation, if any; f.mu must be held.
func (f *fleet) unreserve(addr string) {
	for _, c := range f.reserved[addr] {
		_ = c()
	}
	delete(f.reserved, addr)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// tail returns the last n lines written.
func (b *tailBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := strings.Split(strings.TrimRight(string(b.buf), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
