package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

func TestParseFlags(t *testing.T) {
	base := []string{"-data", "/tmp/p1", "-gossip", "127.0.0.1:7001", "-raft", "127.0.0.1:7002", "-rpc", "127.0.0.1:7003"}
	with := func(extra ...string) []string { return append(append([]string(nil), base...), extra...) }

	cfg, err := parseFlags(with("-name", "p1", "-expect", "3", "-join", "127.0.0.1:7011, 127.0.0.1:7021,",
		"-shards", "4", "-rf", "5", "-ttl", "2s", "-rtt", "10ms", "-log-level", "debug", "-lock", "job", "-hold", "3s", "-loop", "2",
		"-lock-on-usr1", "-report-held", "20ms", "-report-leader", "other", "-report-serving"))
	if err != nil {
		t.Fatal(err)
	}
	nc := cfg.node
	if nc.Name != "p1" || nc.DataDir != "/tmp/p1" || nc.GossipAddr != "127.0.0.1:7001" || nc.RaftAddr != "127.0.0.1:7002" || nc.RPCAddr != "127.0.0.1:7003" {
		t.Errorf("addresses: %+v", nc)
	}
	if got := strings.Join(nc.Join, " "); got != "127.0.0.1:7011 127.0.0.1:7021" {
		t.Errorf("Join = %q", got)
	}
	if nc.BootstrapExpect != 3 || nc.Shards != 4 || nc.ReplicationFactor != 5 || nc.SessionTTL != 2*time.Second || nc.RTT != 10*time.Millisecond {
		t.Errorf("cluster settings: %+v", nc)
	}
	if cfg.lock != "job" || cfg.hold != 3*time.Second || cfg.loop != 2 || cfg.logLevel.String() != "DEBUG" {
		t.Errorf("demo settings: %+v", cfg)
	}
	if !cfg.lockOnUSR1 || cfg.reportHeld != 20*time.Millisecond || cfg.reportLeader != "other" || !cfg.reportServing {
		t.Errorf("report settings: %+v", cfg)
	}

	cfg, err = parseFlags(with("-join", "127.0.0.1:7011"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.node.SessionTTL != node.DefaultSessionTTL || cfg.node.Shards != node.DefaultShards || cfg.loop != 1 || cfg.lock != "" {
		t.Errorf("defaults: %+v", cfg)
	}

	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{with("-expect", "3", "-ttl", "soon"), "-ttl"},
		{with("-expect", "3", "-bogus"), "bogus"},
		{with("-expect", "3", "extra"), `unexpected argument "extra"`},
		{with(), "-expect"},
		{[]string{"-expect", "3", "-gossip", "127.0.0.1:1", "-raft", "127.0.0.1:2", "-rpc", "127.0.0.1:3"}, "-data"},
		{[]string{"-expect", "3", "-data", "/tmp/x"}, "-gossip"},
		{with("-expect", "3", "-log-level", "loud"), "-log-level"},
		{with("-expect", "3", "-lock", "job", "-hold", "-1s"), "-hold"},
		{with("-expect", "3", "-lock", "job", "-loop", "0"), "-loop"},
		{with("-expect", "3", "-loop", "3"), "need -lock"},
		{with("-expect", "3", "-report-held", "20ms"), "need -lock"},
		{with("-expect", "3", "-lock-on-usr1"), "need -lock"},
		{with("-expect", "3", "-lock", "job", "-report-held", "-1s"), "-report-held"},
		{with("-expect", "3", "-report-leader", strings.Repeat("k", node.MaxKeyLen+1)), "-report-leader"},
		{with("-expect", "3", "-lock", strings.Repeat("k", node.MaxKeyLen+1)), "-lock"},
		{with("-expect", "-1"), "BootstrapExpect"},
		{with("-expect", "3", "-ttl", "1s", "-rtt", "50ms"), "SessionTTL"},
		{with("-expect", "3", "-raft", "127.0.0.1:0"), "fixed port"},
		{with("-expect", "3", "-rpc", "nonsense"), "RPCAddr"},
		{with("-expect", "3", "-rpc", "10.0.0.5:7003"), "RPCAddr 10.0.0.5:7003 is not loopback"},
		{with("-expect", "3", "-http", "9100"), "-http \"9100\": want host:port"},
		{with("-expect", "3", "-http", "10.0.0.5:9100"), "-http 10.0.0.5:9100 is not loopback"},
		{with("-expect", "3", "-http", ":9100"), "-http :9100 is not loopback"},
		{with("-expect", "3", "-http-host", "peer-1.ops.example"), "-http-host needs -http"},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
	if cfg, err := parseFlags(with("-expect", "3", "-gossip", "0.0.0.0:7001", "-insecure")); err != nil || !cfg.node.Insecure {
		t.Errorf("-insecure on 0.0.0.0: Insecure %v, err %v; want it set and no error", cfg.node.Insecure, err)
	}
	if cfg, err := parseFlags(with("-expect", "3", "-http", "127.0.0.1:0")); err != nil || cfg.httpAddr != "127.0.0.1:0" {
		t.Errorf("-http 127.0.0.1:0: httpAddr %q, err %v; want it set and no error", cfg.httpAddr, err)
	}
	if cfg, err := parseFlags(with("-expect", "3", "-http", "0.0.0.0:9100", "-insecure")); err != nil || cfg.httpAddr != "0.0.0.0:9100" {
		t.Errorf("-http 0.0.0.0:9100 -insecure: httpAddr %q, err %v; want it set and no error", cfg.httpAddr, err)
	}
	cfg, err = parseFlags(with("-expect", "3", "-http", "127.0.0.2:9100", "-http-host", "peer-1.ops.example, grafana.ops.example,"))
	if got, want := strings.Join(httpHosts(cfg), " "), "127.0.0.2 peer-1.ops.example grafana.ops.example"; err != nil || got != want {
		t.Errorf("-http 127.0.0.2:9100 -http-host ...: hosts %q, err %v; want %q", got, err, want)
	}
	cfg, err = parseFlags(with("-expect", "3", "-http", "0.0.0.0:9100", "-insecure"))
	if got := httpHosts(cfg); err != nil || len(got) != 0 {
		t.Errorf("-http 0.0.0.0:9100: hosts %q, err %v; want none (every interface is no name)", got, err)
	}
	if _, err := parseFlags([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

// TestRunRejectsBadFlags checks the exit code and message a user sees; it
// starts nothing, so it needs no build.
func TestRunRejectsBadFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-data", "/tmp/x", "-ttl", "soon"}, &stdout, &stderr); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout: %q, want nothing", stdout.String())
	}
	if !strings.Contains(stderr.String(), `invalid value "soon" for flag -ttl`) {
		t.Errorf("stderr: %q", stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "-join addrs") {
		t.Errorf("-h: exit code %d, usage %q", code, stderr.String())
	}
}

// TestProcesses runs peers as OS processes and crashes some of them: three
// servers form the cluster, clients that host no replicas contend for one
// key, and the lock must move on with a higher fencing token each time its
// holder dies or leaves, while a server crash (a minority) changes nothing.
// The subtests differ in which server crashes: a follower of the key's
// shard, or its leader, after which the holder's keepalives must find the
// new leader before its lease runs out.
func TestProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program and runs 6 peer processes")
	}
	bin := buildPeer(t)
	t.Run("follower-crash", func(t *testing.T) { testProcesses(t, bin, false) })
	t.Run("leader-crash", func(t *testing.T) {
		testProcesses(t, bin, true)
	})
}

func testProcesses(t *testing.T, bin string, crashLeader bool) {
	const ttl = 2 * time.Second
	c := newCluster(t, bin)
	servers := []string{"s1", "s2", "s3"}
	clients := []string{"c1", "c2", "c3"}
	args, joinAllBut := c.layout(t, servers, clients, ttl.String())

	procs := c.startServers(servers, args, joinAllBut)
	for _, cl := range clients[:2] {
		procs[cl] = c.start(cl, append(args[cl], "-client", "-join", joinAllBut(""), "-lock", "job", "-hold", "0")...)
	}

	// One client gets the lock; the other queues behind it.
	first := c.await(20*time.Second, "a client to acquire job", prefix("acquired job"))
	tok1 := token(t, first)
	c.quiet(time.Second, "a second holder while "+first.p.name+" holds job", prefix("acquired"))
	second := procs["c1"]
	if first.p == second {
		second = procs["c2"]
	}

	// The holder crashes: its session expires after the TTL and the waiter
	// is granted the lock with a higher token.
	crashed := time.Now()
	c.kill(first.p)
	e := c.await(15*time.Second, second.name+" to acquire job after "+first.p.name+" crashed", prefix("acquired job"))
	if e.p != second {
		t.Fatalf("%s acquired job, want %s", e.p.name, second.name)
	}
	took := e.at.Sub(crashed)
	t.Logf("%s acquired job %v after %s crashed", second.name, took.Round(time.Millisecond), first.p.name)
	// The crashed holder's session must be expired by the TTL, not released
	// at once: it sent keepalives several times per TTL until it died. (That
	// no grant overlaps a lease the holder could still rely on is checked
	// with injected clocks in package node.)
	if took < ttl/4 {
		t.Errorf("%s was granted job %v after the holder crashed: the session was not held for its TTL of %v", second.name, took, ttl)
	}
	tok2 := token(t, e)
	if tok2 <= tok1 {
		t.Errorf("token %d after the crash is not above %d", tok2, tok1)
	}

	// A minority of the servers crashes: the lock stays held, and a new
	// client queues for it instead of being granted it. The leader of
	// job's shard is the server that expired the crashed holder's session.
	var leader, follower *proc
	for _, s := range servers {
		if procs[s].stderr.contains("expiring session", "owner="+first.p.name) {
			leader = procs[s]
		} else if follower == nil {
			follower = procs[s]
		}
	}
	if leader == nil {
		t.Fatalf("no server logged expiring %s's session: cannot tell the leader of job's shard", first.p.name)
	}
	victim := follower
	if crashLeader {
		victim = leader
	}
	t.Logf("crashing server %s", victim.name)
	serverDown := time.Now()
	c.kill(victim)
	third := c.start("c3", append(args["c3"], "-client", "-join", joinAllBut(""), "-lock", "job", "-hold", "0")...)
	c.await(20*time.Second, "c3 ready with "+victim.name+" down", func(e event) bool { return e.p == third && strings.HasPrefix(e.line, "ready") })
	c.quiet(max(2*time.Second, 3*time.Second-time.Since(serverDown)), "a change of holder with "+victim.name+" down", prefix("acquired"))

	// The holder leaves gracefully: its Close ends its session at once, so
	// c3 is granted the lock well within the TTL.
	left := time.Now()
	if err := second.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// c3 may print its grant before c2 prints its release: take both in
	// either order.
	released := false
	for e = (event{}); !released || e.p == nil; {
		got := c.await(5*time.Second, second.name+" to release job and c3 to acquire it", func(e event) bool {
			return e.line == "released job" || strings.HasPrefix(e.line, "acquired job")
		})
		switch {
		case got.p == second && got.line == "released job":
			released = true
		case got.p == third && strings.HasPrefix(got.line, "acquired job"):
			e = got
		default:
			t.Fatalf("%s printed %q, want only %s to release and c3 to acquire", got.p.name, got.line, second.name)
		}
	}
	t.Logf("c3 acquired job %v after %s was signalled", e.at.Sub(left).Round(time.Millisecond), second.name)
	if tok3 := token(t, e); tok3 <= tok2 {
		t.Errorf("token %d after the release is not above %d", tok3, tok2)
	}
	select {
	case <-second.exited:
		if code := second.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%s exited with %d after SIGTERM, want 0", second.name, code)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("%s did not exit within 10s of SIGTERM", second.name)
	}
}

// cluster runs the peer binary as child processes and merges their stdout
// lines into one stream, in arrival order.
type cluster struct {
	t      *testing.T
	bin    string
	dir    string
	events chan event

	mu    sync.Mutex
	procs []*proc

	// observers see every line await and drain take from events, in
	// order, on the test goroutine; they may fail the test.
	observers []func(event)
	// lostOK lets await take "lost" lines: the scenario expects leases to
	// end, and an observer judges them.
	lostOK bool

	// reserved holds the loopback ports layout handed out, each still
	// bound by the test until the process given it starts (release): a
	// port closed at once could be taken meanwhile by any socket on the
	// machine, such as the running servers' outgoing connections, whose
	// source ports come from the same ephemeral range.
	reserved map[string][]func() error
}

// release closes the reservations of the addresses among args.
func (c *cluster) release(args ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range args {
		c.unreserve(a)
	}
}

// unreserve closes addr's reservation, if any; c.mu must be held.
func (c *cluster) unreserve(addr string) {
	for _, close := range c.reserved[addr] {
		_ = close()
	}
	delete(c.reserved, addr)
}

type event struct {
	p    *proc
	line string
	at   time.Time
}

type proc struct {
	name   string
	cmd    *exec.Cmd
	stderr *tailBuffer
	exited chan struct{} // closed once the process was waited for
}

func newCluster(t *testing.T, bin string) *cluster {
	c := &cluster{t: t, bin: bin, dir: t.TempDir(), events: make(chan event, 1024), reserved: map[string][]func() error{}}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for a := range c.reserved {
			c.unreserve(a)
		}
		for _, p := range c.procs {
			_ = p.cmd.Process.Kill()
		}
		for _, p := range c.procs {
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				t.Errorf("%s (pid %d) still running after kill", p.name, p.cmd.Process.Pid)
			}
			if t.Failed() {
				t.Logf("stderr of %s, last lines:\n%s", p.name, p.stderr.tail(40))
			}
		}
	})
	return c
}

func (c *cluster) start(name string, args ...string) *proc {
	c.t.Helper()
	return c.startBin(c.bin, name, args...)
}

// startBin is start with another build of the program (upgrade tests).
func (c *cluster) startBin(bin, name string, args ...string) *proc {
	c.t.Helper()
	c.release(args...)
	p := &proc{name: name, cmd: exec.Command(bin, args...), stderr: &tailBuffer{max: 64 << 10}, exited: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.events <- event{p: p, line: sc.Text(), at: time.Now()}
		}
		_ = p.cmd.Wait() // after the reads, as StdoutPipe requires
	}()
	return p
}

// kill crashes p (SIGKILL) and waits until it is gone.
func (c *cluster) kill(p *proc) {
	c.t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		c.t.Fatalf("kill %s: %v", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s still running 10s after SIGKILL", p.name)
	}
}

// observe has f see every line taken from now on.
func (c *cluster) observe(f func(event)) { c.observers = append(c.observers, f) }

// note logs a line taken from events and shows it to the observers. Held
// lines come every few milliseconds and are left to the observers.
func (c *cluster) note(e event) {
	c.t.Helper()
	if !strings.HasPrefix(e.line, "held ") {
		c.t.Logf("%s: %s", e.p.name, e.line)
	}
	for _, f := range c.observers {
		f(e)
	}
}

// await returns the first line that matches want, failing the test after
// timeout or on any "lost" line (unless lostOK): no lease is lost in these
// scenarios.
func (c *cluster) await(timeout time.Duration, what string, want func(event) bool) event {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case e := <-c.events:
			c.note(e)
			if strings.HasPrefix(e.line, "lost") && !c.lostOK {
				c.t.Fatalf("while waiting for %s: %s printed %q", what, e.p.name, e.line)
			}
			if want(e) {
				return e
			}
		case <-deadline:
			c.t.Fatalf("no %s within %v", what, timeout)
		}
	}
}

// quiet fails the test if a line matching bad (or a "lost" line) appears
// within d.
func (c *cluster) quiet(d time.Duration, what string, bad func(event) bool) {
	c.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case e := <-c.events:
			c.note(e)
			if bad(e) || strings.HasPrefix(e.line, "lost") {
				c.t.Fatalf("%s: %s printed %q", what, e.p.name, e.line)
			}
		case <-deadline:
			return
		}
	}
}

// drain takes every line for d and leaves them to the observers.
func (c *cluster) drain(d time.Duration) {
	c.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case e := <-c.events:
			c.note(e)
		case <-deadline:
			return
		}
	}
}

func prefix(s string) func(event) bool {
	return func(e event) bool { return strings.HasPrefix(e.line, s) }
}

func token(t *testing.T, e event) uint64 {
	t.Helper()
	var key string
	var tok uint64
	if _, err := fmt.Sscanf(e.line, "acquired %s token=%d", &key, &tok); err != nil {
		t.Fatalf("%s printed %q: %v", e.p.name, e.line, err)
	}
	return tok
}

// freeAddrs returns n distinct loopback addresses whose ports are free for
// both TCP and UDP (gossip uses both), holding each until all are picked.
// startServers starts servers as one bootstrapping cluster (each expects
// them all and joins the others) with their layout args, and waits until
// every one printed ready.
func (c *cluster) startServers(servers []string, args map[string][]string, joinAllBut func(string) string) map[string]*proc {
	procs := map[string]*proc{}
	expect := strconv.Itoa(len(servers))
	// Every server's ports are free before the first one starts and joins
	// the others.
	for _, s := range servers {
		c.release(args[s]...)
	}
	for _, s := range servers {
		procs[s] = c.start(s, append(args[s], "-expect", expect, "-join", joinAllBut(s))...)
	}
	for range servers {
		c.await(30*time.Second, "a server ready", prefix("ready"))
	}
	return procs
}

// layout gives each server and other process its flags (free loopback
// ports, a data dir under the cluster's, RTT 10ms, 4 shards, ttl) and
// returns them with joinAllBut, which lists the servers' gossip addresses
// except self's.
func (c *cluster) layout(t *testing.T, servers, others []string, ttl string) (args map[string][]string, joinAllBut func(self string) string) {
	t.Helper()
	names := append(append([]string(nil), servers...), others...)
	addrs := c.reserve(t, 3*len(names))
	gossip := map[string]string{}
	args = map[string][]string{}
	for i, name := range names {
		gossip[name] = addrs[3*i]
		args[name] = []string{"-name", name, "-data", filepath.Join(c.dir, name),
			"-gossip", addrs[3*i], "-raft", addrs[3*i+1], "-rpc", addrs[3*i+2],
			"-rtt", "10ms", "-ttl", ttl, "-shards", "4", "-log-level", "info"}
	}
	joinAllBut = func(self string) string {
		var j []string
		for _, s := range servers {
			if s != self {
				j = append(j, gossip[s])
			}
		}
		return strings.Join(j, ",")
	}
	return args, joinAllBut
}

// buildPeer builds the peer program into a temporary dir.
func buildPeer(t *testing.T, tags ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "peer")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// reserve returns n free loopback addresses, TCP and UDP free on each
// port (memberlist uses both), and keeps them bound until release.
func (c *cluster) reserve(t *testing.T, n int) []string {
	t.Helper()
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
			t.Fatal(err)
		}
		u, err := net.ListenPacket("udp", l.Addr().String())
		if err != nil {
			skipped = append(skipped, l)
			continue // UDP side taken: try another port
		}
		a := l.Addr().String()
		c.mu.Lock()
		c.reserved[a] = []func() error{l.Close, u.Close}
		c.mu.Unlock()
		addrs = append(addrs, a)
	}
	return addrs
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

// contains reports whether one retained line has every one of subs.
func (b *tailBuffer) contains(subs ...string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, line := range strings.Split(string(b.buf), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			return true
		}
	}
	return false
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

// TestProcessesGrow grows a cluster of three server processes by two
// processes started with -expect 0 -join, and checks that the new peers
// took over replicas, first as the layout shows it (-print-placement),
// then by crashing two of the three original servers: a shard with a
// replica on a new peer keeps a quorum, and locks on it keep being granted
// with increasing tokens. Had the new peers got no replicas, every shard
// would live on the original three only and lose its quorum.
func TestProcessesGrow(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program and runs 5 peer processes")
	}
	bin := buildPeer(t)
	c := newCluster(t, bin)
	servers := []string{"s1", "s2", "s3"}
	grown := []string{"n4", "n5"}
	args, joinAllBut := c.layout(t, servers, grown, "2s")
	readyOf := func(p *proc) func(event) bool {
		return func(e event) bool { return e.p == p && strings.HasPrefix(e.line, "ready") }
	}

	procs := c.startServers(servers, args, joinAllBut)

	// Two more peers join; the last one prints the layout once it has
	// settled over all five.
	started := time.Now()
	procs["n4"] = c.start("n4", append(args["n4"], "-join", joinAllBut(""))...)
	c.await(20*time.Second, "n4 ready", readyOf(procs["n4"]))
	procs["n5"] = c.start("n5", append(args["n5"], "-join", joinAllBut(""), "-print-placement", "5")...)
	c.await(20*time.Second, "n5 ready", readyOf(procs["n5"]))
	head := c.await(30*time.Second, "n5 to print a settled layout of 5 peers", func(e event) bool {
		return e.p == procs["n5"] && strings.HasPrefix(e.line, "placement ")
	})
	t.Logf("layout settled over 5 peers %v after n4 was started", head.at.Sub(started).Round(time.Millisecond))
	replicas := map[string]int{}
	for _, f := range strings.Fields(strings.TrimPrefix(head.line, "placement ")) {
		var r, l int
		name, counts, _ := strings.Cut(f, "=")
		if _, err := fmt.Sscanf(counts, "%d/%d", &r, &l); err != nil {
			t.Fatalf("placement line %q: %v", head.line, err)
		}
		replicas[name] = r
	}
	if len(replicas) != 5 {
		t.Fatalf("placement line %q lists %d peers, want 5", head.line, len(replicas))
	}
	for _, name := range grown {
		if replicas[name] == 0 {
			t.Fatalf("%s hosts no replica after growing: %q", name, head.line)
		}
	}

	// The shard lines follow: 4 lock shards and the meta shard. Pick a lock
	// shard with a replica on a new peer, and two original servers to
	// crash of which at most one hosts it: the shard keeps a quorum only
	// thanks to its replica(s) on the new peers.
	type shard struct {
		id          uint64
		hosts       []string
		key, leader string
		meta        bool
	}
	var shards []shard
	for len(shards) < 5 {
		e := c.await(5*time.Second, "n5's shard lines", func(e event) bool {
			return e.p == procs["n5"] && strings.HasPrefix(e.line, "shard ")
		})
		var s shard
		for i, f := range strings.Fields(e.line) {
			k, v, _ := strings.Cut(f, "=")
			switch {
			case i == 1:
				fmt.Sscan(f, &s.id)
			case k == "hosts":
				s.hosts = strings.Split(v, ",")
			case k == "leader":
				s.leader = v
			case k == "key":
				s.key = v
			case f == "meta":
				s.meta = true
			}
		}
		shards = append(shards, s)
	}
	var target *shard
	var victims []string
	for i := range shards {
		s := &shards[i]
		if s.meta || s.key == "" || len(s.hosts) != 3 {
			continue
		}
		var hostOrig, otherOrig []string
		for _, name := range servers {
			if slices.Contains(s.hosts, name) {
				hostOrig = append(hostOrig, name)
			} else {
				otherOrig = append(otherOrig, name)
			}
		}
		if len(hostOrig) == 3 {
			continue // on the original servers only
		}
		// One server not hosting it, and one hosting it if any does.
		target = s
		victims = []string{otherOrig[0], append(hostOrig, otherOrig[1:]...)[0]}
		break
	}
	if target == nil {
		t.Fatalf("every lock shard is hosted by the original servers only: %+v", shards)
	}
	t.Logf("shard %d (key %q) is on %v; will crash %v", target.id, target.key, target.hosts, victims)

	// Restart both new peers on their data dirs (they keep their replicas)
	// to lock and unlock the target shard's key in turn.
	for _, name := range grown {
		p := procs[name]
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.exited:
			if code := p.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("%s exited with %d after SIGTERM, want 0", name, code)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not exit within 10s of SIGTERM", name)
		}
		procs[name] = c.start(name, append(args[name], "-join", joinAllBut(""),
			"-lock", target.key, "-loop", "1000000", "-hold", "50ms")...)
		c.await(20*time.Second, name+" ready again", readyOf(procs[name]))
	}
	last := map[*proc]uint64{}
	seen := map[uint64]string{}
	grants := func(n int, within time.Duration, what string) {
		t.Helper()
		got := map[*proc]int{}
		deadline := time.Now().Add(within)
		for got[procs["n4"]] < n || got[procs["n5"]] < n {
			e := c.await(time.Until(deadline), what, prefix("acquired "+target.key+" "))
			tok := token(t, e)
			if tok <= last[e.p] {
				t.Fatalf("%s got token %d after token %d", e.p.name, tok, last[e.p])
			}
			if other, dup := seen[tok]; dup {
				t.Fatalf("%s and %s both got token %d", other, e.p.name, tok)
			}
			last[e.p], seen[tok] = tok, e.p.name
			got[e.p]++
		}
	}
	grants(2, 20*time.Second, "n4 and n5 to acquire "+target.key+" twice each")

	// Crash two of the three original servers.
	crashed := time.Now()
	for _, v := range victims {
		c.kill(procs[v])
	}
	grants(3, 20*time.Second, fmt.Sprintf("n4 and n5 to acquire %s three times each with %v crashed", target.key, victims))
	t.Logf("with %v crashed, n4 and n5 acquired %s 3 times each within %v", victims, target.key, time.Since(crashed).Round(time.Millisecond))
}

// TestProcessesPause pauses the holder of a lock (SIGSTOP) for three
// session TTLs: its keepalives stop, so the cluster expires its session
// and grants the lock to the waiting client with a higher token while the
// holder is still stopped. Once resumed (SIGCONT), the holder must report
// the lock lost promptly, since its lease deadline passed while it was
// stopped, and must print nothing else about the lock meanwhile.
func TestProcessesPause(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program and runs 5 peer processes")
	}
	const ttl = 2 * time.Second
	bin := buildPeer(t)
	c := newCluster(t, bin)
	servers := []string{"s1", "s2", "s3"}
	clients := []string{"c1", "c2"}
	args, joinAllBut := c.layout(t, servers, clients, ttl.String())

	procs := c.startServers(servers, args, joinAllBut)
	for _, cl := range clients {
		procs[cl] = c.start(cl, append(args[cl], "-client", "-join", joinAllBut(""), "-lock", "job", "-hold", "0")...)
	}
	// Registered after newCluster's cleanup, so it runs before it: every
	// process is resumed before it is killed. SIGCONT to a running process
	// does nothing.
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, p := range c.procs {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	})

	// Both clients ready (in either order) and one of them holding job.
	var first event
	ready := map[*proc]bool{}
	for first.p == nil || len(ready) < len(clients) {
		e := c.await(20*time.Second, "both clients ready and one holding job", func(e event) bool {
			return strings.HasPrefix(e.line, "ready") || strings.HasPrefix(e.line, "acquired job")
		})
		if strings.HasPrefix(e.line, "ready") {
			ready[e.p] = true
		} else if first.p != nil {
			t.Fatalf("%s acquired job while %s holds it: %q", e.p.name, first.p.name, e.line)
		} else {
			first = e
		}
	}
	holder := first.p
	tok1 := token(t, first)
	waiter := procs["c1"]
	if holder == waiter {
		waiter = procs["c2"]
	}

	// Pause the holder for 3×TTL. The waiter must be granted the lock with
	// a higher token while the holder is stopped; no process may print
	// anything else about the lock.
	if err := syscall.Kill(holder.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", holder.name, err)
	}
	stopped := time.Now()
	t.Logf("stopped %s, holding job with token %d", holder.name, tok1)
	resumeAt := stopped.Add(3 * ttl)
	grantBy := time.After(10 * time.Second)
	var granted *event
	for granted == nil || time.Now().Before(resumeAt) {
		var wake <-chan time.Time
		if granted != nil {
			wake = time.After(time.Until(resumeAt))
		}
		select {
		case e := <-c.events:
			t.Logf("%s: %s", e.p.name, e.line)
			if e.p == waiter && strings.HasPrefix(e.line, "acquired job") && granted == nil {
				granted = &e
				continue
			}
			t.Fatalf("while %s was stopped: %s printed %q", holder.name, e.p.name, e.line)
		case <-grantBy:
			if granted == nil {
				t.Fatalf("%s was not granted job within 10s of stopping %s", waiter.name, holder.name)
			}
		case <-wake:
		}
	}
	tok2 := token(t, *granted)
	t.Logf("%s acquired job with token %d %v after %s was stopped", waiter.name, tok2,
		granted.at.Sub(stopped).Round(time.Millisecond), holder.name)
	if tok2 <= tok1 {
		t.Errorf("token %d granted while %s was stopped is not above its token %d", tok2, holder.name, tok1)
	}

	// Resume the holder: its lease deadline is long past, so it must print
	// that it lost the lock, and nothing else.
	if err := syscall.Kill(holder.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT %s: %v", holder.name, err)
	}
	resumed := time.Now()
	t.Logf("resumed %s after %v", holder.name, resumed.Sub(stopped).Round(time.Millisecond))
	lostBy := time.After(5 * time.Second)
	for lost := false; !lost; {
		select {
		case e := <-c.events:
			t.Logf("%s: %s", e.p.name, e.line)
			if e.p != holder || !strings.HasPrefix(e.line, "lost job: ") {
				t.Fatalf("after resuming %s: %s printed %q, want only %s to print \"lost job: ...\"", holder.name, e.p.name, e.line, holder.name)
			}
			lost = true
			t.Logf("%s reported job lost %v after SIGCONT", holder.name, e.at.Sub(resumed).Round(time.Millisecond))
		case <-lostBy:
			t.Fatalf("%s printed no \"lost job\" line within 5s of SIGCONT; its stderr, last lines:\n%s", holder.name, holder.stderr.tail(40))
		}
	}
	// Nobody else changes hands or loses anything for a moment after.
	c.quiet(time.Second, "after "+holder.name+" reported job lost", func(event) bool { return true })
}
