package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/release"
	"github.com/lockmesh/lockmesh/node"
)

// TestUpgradeFromPrevious runs the previous release (release.Previous,
// built from git history) and this tree in one cluster of processes, under
// lock load, through the steps docs/UPGRADING.md tells operators to take:
//
//  1. three servers of the previous release form the cluster; four
//     client-only peers, two of each release, contend in pairs for two
//     keys (lock, hold 30ms, unlock, in a loop, reporting every 10ms
//     that they still hold);
//  2. s1, then s2, are stopped (SIGTERM) and started with this tree's
//     binary on the same name and data dir;
//  3. s2 is rolled back to the previous release, as allowed before the
//     cluster's feature level is raised;
//  4. s2 and s3 are upgraded: every server runs this tree;
//  5. only when this tree speaks a newer feature level than the previous
//     release: the clients of the previous release are upgraded too (the
//     level rises only when every gossip member speaks it, client-only
//     peers included). Until then this tree's clients try what the newest
//     level brings (-probe-level: a lock with a value, level 4) every
//     100ms and must be refused, saying why, while mutexes go on; after
//     the raise they must be granted one. Once the cluster's level is
//     raised, s3 is started with the previous release on its upgraded
//     data dir and must refuse to start or serve, saying on its own
//     stderr why (a line naming the feature level). 0.2.0 (f846c0d)
//     speaks levels 1 to 3 and this tree 1 to 4, so this step runs;
//     between two releases of one level range it logs why it does not.
//
// Throughout, a ledger per key (safety_test.go) fails the test on a token
// that does not rise or a grant made while an earlier holder still
// reported holding. No lock or unlock call may fail: the peer program
// exits 1 on any error Lock or Unlock returns, and the test fails on any
// process that exits without being stopped, or with a non-zero code when
// stopped. Errors of a leadership move or a stopping replica (those
// router.Retryable accepts: timeouts, "not leader", shard not ready or
// closed, an unavailable peer) are retried inside Lock and Unlock and are
// not failures; nothing else is tolerated. No lease may be lost either: a
// graceful restart moves leaderships well within the TTL.
//
// A server is stopped only once the one restarted before it is back as
// docs/UPGRADING.md tells operators to wait for: ready, and its replicas
// caught up. For this tree's binary that is its serving line
// (-report-serving, printed when Node.WaitServing returns: every lock
// shard answered a linearizable read through this server's own replica).
// The previous release cannot be asked for that line, so for both
// releases the test also asks the server from outside, over lockmesh's
// RPC, the question its controller asks before it counts a new replica
// (methodCaughtUp, wire-compatible with every release; see replicaProbe): does
// your replica of this shard serve a linearizable read? Every shard it
// runs, the meta shard included, must say yes. The same check runs on all
// three servers once the cluster has formed, and the state of every
// server's replicas is logged just before each SIGTERM. On top of that the
// restarted server must name the leader of job's shard (-report-leader)
// and both keys must be granted three more times.
//
// With LOCKMESH_UPGRADE_CONTROL=1 this tree's binary plays both releases:
// a control run, to tell a failure between releases from one of this tree
// alone.
//
// A clone without the previous release's commit (a shallow one) fails the
// test, saying to fetch the history; it never skips for that.
//
// It found that a restart tripped dragonboat's circuit breaker on the
// other peers (their connections to the old process failed on first
// write), so the next stop lost quorum although every replica was caught
// up; internal/raftnet now redials instead (docs/TESTING.md, section 5).
func TestUpgradeFromPrevious(t *testing.T) {
	const upgradeControlEnv = "LOCKMESH_UPGRADE_CONTROL"
	if testing.Short() {
		t.Skip("builds two releases of the program and runs 7 peer processes")
	}
	const ttl = 2 * time.Second
	newBin := buildPeer(t)
	oldBin := buildPrevious(t)
	if os.Getenv(upgradeControlEnv) != "" {
		t.Logf("%s is set: this tree's binary plays the previous release too (a control run)", upgradeControlEnv)
		oldBin = newBin
	}
	oldLo, oldHi := levelsOf(t, oldBin, true)
	newLo, newHi := levelsOf(t, newBin, false)
	t.Logf("previous release %s (%.7s) speaks levels %d-%d; this tree, %s, speaks %d-%d",
		release.PreviousVersion, release.Previous, oldLo, oldHi, release.Version, newLo, newHi)
	if newLo > oldHi || newHi < oldHi {
		t.Fatalf("this tree speaks levels %d-%d, which does not include the previous release's newest, %d: "+
			"a rolling upgrade from it is impossible", newLo, newHi, oldHi)
	}

	c := newCluster(t, newBin)
	// Registered after newCluster's cleanup, so it runs first: on a
	// failure, every warning each process kept, not only its last lines.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, p := range c.procs {
			var warn []string
			for _, line := range strings.Split(p.stderr.tail(1000), "\n") {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.HasPrefix(line, "peer: ") {
					warn = append(warn, line)
				}
			}
			t.Logf("warnings and errors of %s (pid %d), as it kept them:\n%s", p.name, p.cmd.Process.Pid, strings.Join(warn, "\n"))
		}
	})
	c.lostOK = true // counted per phase below, and failed on
	servers := []string{"s1", "s2", "s3"}
	clients := []string{"c1", "c2", "c3", "c4"}
	args, joinAllBut := c.layout(t, servers, clients, ttl.String())
	keys := []string{"job", "task"}
	ledgers := map[string]*ledger{}
	for _, k := range keys {
		ledgers[k] = newLedger(t, k)
		c.observe(ledgers[k].note)
	}
	u := &upgrade{c: c, bins: map[string]string{oldBin: release.PreviousVersion, newBin: release.Version}, running: map[string]*proc{},
		ready: map[*proc]bool{}, serving: map[*proc]bool{}, leader: map[*proc]string{}, expectExit: map[*proc]bool{}, newHi: newHi}
	c.observe(u.note)

	// The previous release forms the cluster.
	u.phase("previous")
	u.newBin = newBin
	u.probe = newReplicaProbe(t)
	u.rpc = map[string]string{}
	for _, s := range servers {
		args[s] = append(args[s], "-expect", "3", "-join", joinAllBut(s), "-report-leader", "job")
		u.rpc[s] = flagValue(args[s], "-rpc")
		u.running[s] = u.startServer(oldBin, s, args[s])
	}
	for _, s := range servers {
		u.waitReady(s)
	}
	u.shards = u.clusterShards(servers)
	for _, s := range servers {
		u.waitServing(s)
	}
	clientArgs := map[string][]string{}
	for i, cl := range clients {
		bin := []string{oldBin, newBin}[i%2]
		key := keys[i/2]
		clientArgs[cl] = append(args[cl], "-client", "-join", joinAllBut(""),
			"-lock", key, "-loop", "1000000", "-hold", "30ms", "-report-held", "10ms")
		u.running[cl] = c.startBin(bin, cl, u.withProbe(bin, clientArgs[cl])...)
	}
	for _, cl := range clients {
		u.waitReady(cl)
	}
	u.waitGrants(5, keys)

	restart := func(phase, s, bin string) {
		u.phase(phase)
		u.logReplicas(servers, "before "+s+" is stopped")
		u.stop(s)
		u.running[s] = u.startServer(bin, s, args[s])
		u.waitReady(s)
		u.waitServing(s)
		u.wait(20*time.Second, s+" to name the leader of job's shard", func() bool {
			l, ok := u.leader[u.running[s]]
			return ok && l != "-"
		})
		u.waitGrants(3, keys)
	}
	restart("upgrade s1", "s1", newBin)
	restart("upgrade s2", "s2", newBin)
	restart("roll back s2", "s2", oldBin)
	restart("upgrade s2 again", "s2", newBin)
	restart("upgrade s3", "s3", newBin)
	u.phase("all servers upgraded")
	u.waitGrants(5, keys)

	if newHi > oldHi {
		// The level rises only once every member of the mesh speaks it,
		// client-only peers too: upgrade those of the previous release.
		u.phase("clients upgraded")
		// While a peer of the previous release runs, what the new level
		// brings is refused, saying why, and the mutexes went on
		// meanwhile.
		if u.levelOK > 0 {
			t.Fatalf("a lock with a value (level %d) was granted while peers of the previous release ran: %s", newHi, u.levelLines)
		}
		if u.levelRefused == 0 {
			t.Fatalf("no client of this tree said a lock with a value was refused for want of feature level %d: %s", newHi, u.levelLines)
		}
		for i, cl := range clients {
			if i%2 == 0 {
				u.stop(cl)
				u.running[cl] = c.startBin(newBin, cl, u.withProbe(newBin, clientArgs[cl])...)
				u.waitReady(cl)
			}
		}
		u.waitGrants(3, keys)

		u.phase("previous release after the raise")
		u.wait(30*time.Second, fmt.Sprintf("the cluster's feature level to be raised to %d", newHi), func() bool {
			for _, s := range servers {
				if u.running[s].stderr.contains("raising the cluster's feature level") {
					return true
				}
			}
			return false
		})
		u.waitGrants(3, keys)
		u.wait(30*time.Second, "a client of this tree to be granted a lock with a value after the raise", func() bool { return u.levelOK > 0 })
		u.stop("s3")
		old := c.startBin(oldBin, "s3", args["s3"]...)
		u.running["s3"] = old
		u.expectExit[old] = true // it may refuse by exiting
		u.wait(30*time.Second, "the previous release's s3 to exit or to say why it refuses the cluster", func() bool {
			return exited(old) || refusesLevel(old)
		})
		c.drain(2 * time.Second) // a refusing peer must not turn ready meanwhile
		if u.ready[old] && !refusesLevel(old) {
			t.Errorf("the previous release's s3 started and served a cluster at level %d, which it does not speak", newHi)
		}
		if !refusesLevel(old) {
			t.Errorf("the previous release's s3 did not say on stderr that it does not speak the cluster's feature level; last lines:\n%s",
				old.stderr.tail(20))
		}
		t.Logf("the previous release on s3's upgraded data dir: exited=%v ready=%v; it said: %s",
			exited(old), u.ready[old], refusalLine(old))
		u.stop("s3")
		restart("s3 upgraded again", "s3", newBin)
	} else {
		t.Logf("no level raise between the releases (previous speaks %d-%d, this tree %d-%d): "+
			"the phase with a previous-release peer after the raise does not run; a release that adds a level (level 4, coordination) turns it on",
			oldLo, oldHi, newLo, newHi)
	}

	u.phase("end")
	for _, cl := range clients {
		u.stop(cl)
	}
	c.drain(500 * time.Millisecond)
	u.report(keys)
	for _, k := range keys {
		if n := ledgers[k].violations; n > 0 {
			t.Errorf("%s: %d violations (reused or falling tokens, or overlapping holders)", k, n)
		}
	}
}

// upgrade follows the processes of TestUpgradeFromPrevious and counts, per
// phase, the grants and lost leases of every key.
type upgrade struct {
	c       *cluster
	bins    map[string]string // binary path -> release
	running map[string]*proc  // by peer name: the process running now
	ready   map[*proc]bool
	leader  map[*proc]string // each process's last leader line for job
	// expectExit marks processes that may exit without being stopped.
	expectExit map[*proc]bool
	phases     []*phaseCount

	newBin  string         // this tree's binary: it has -report-serving
	serving map[*proc]bool // printed serving (-report-serving)
	probe   *replicaProbe
	rpc     map[string]string // server name -> its -rpc address
	shards  []uint64          // every shard of the cluster, meta included

	// level lines of this tree's clients (-probe-level): how many said
	// ok and how many said refused for want of the newest feature level,
	// newHi.
	levelOK, levelRefused int
	levelLines            []string
	newHi                 uint8
}

type phaseCount struct {
	name    string
	start   time.Time
	grants  map[string]int // by key
	byProc  map[string]int // by process name
	lost    int
	lostBy  []string
	maxTok  map[string]uint64
	elapsed time.Duration
}

func (u *upgrade) phase(name string) {
	now := time.Now()
	if n := len(u.phases); n > 0 {
		u.phases[n-1].elapsed = now.Sub(u.phases[n-1].start)
	}
	if name != "" {
		u.c.t.Logf("== phase %q", name)
	}
	u.phases = append(u.phases, &phaseCount{name: name, start: now, grants: map[string]int{}, byProc: map[string]int{}, maxTok: map[string]uint64{}})
}

func (u *upgrade) note(e event) {
	f := strings.Fields(e.line)
	if len(f) < 2 || len(u.phases) == 0 {
		return
	}
	ph := u.phases[len(u.phases)-1]
	switch f[0] {
	case "ready":
		u.ready[e.p] = true
	case "serving":
		u.serving[e.p] = true
	case "leader":
		if len(f) == 5 {
			u.leader[e.p] = f[3]
		}
	case "acquired":
		ph.grants[f[1]]++
		ph.byProc[e.p.name]++
		if tok, _, err := parseTokenAt(f); err == nil {
			ph.maxTok[f[1]] = max(ph.maxTok[f[1]], tok)
		}
	case "lost":
		ph.lost++
		ph.lostBy = append(ph.lostBy, e.p.name+": "+e.line)
	case "level":
		u.levelLines = append(u.levelLines, e.p.name+": "+e.line)
		switch {
		case f[1] == "ok":
			u.levelOK++
		case strings.Contains(e.line, fmt.Sprintf("feature level %d", u.newHi)):
			u.levelRefused++
		}
	}
}

// withProbe adds -probe-level to the args of this tree's binary; the
// previous release has no such flag.
func (u *upgrade) withProbe(bin string, args []string) []string {
	if bin != u.newBin {
		return args
	}
	return append(slices.Clone(args), "-probe-level", "probe")
}

// check fails the test on a process that exited unasked (a failed lock or
// unlock call, or a crash) or on a lost lease.
func (u *upgrade) check() {
	t := u.c.t
	t.Helper()
	for name, p := range u.running {
		if exited(p) && !u.expectExit[p] {
			t.Fatalf("%s (%s) exited with %v without being stopped; its stderr, last lines:\n%s",
				name, u.bins[p.cmd.Path], p.cmd.ProcessState, p.stderr.tail(20))
		}
	}
	for _, ph := range u.phases {
		if ph.lost > 0 {
			t.Fatalf("phase %q: %d leases lost: %s", ph.name, ph.lost, strings.Join(ph.lostBy, "; "))
		}
	}
}

// wait is cluster.until with check after every line.
func (u *upgrade) wait(timeout time.Duration, what string, cond func() bool) {
	u.c.t.Helper()
	u.c.until(timeout, what, func() bool {
		u.check()
		return cond()
	})
}

func (u *upgrade) waitReady(name string) {
	u.c.t.Helper()
	p := u.running[name]
	u.wait(30*time.Second, fmt.Sprintf("%s (%s) ready", name, u.bins[p.cmd.Path]), func() bool { return u.ready[p] })
}

// startServer starts server name with bin; this tree's binary is also
// asked for its serving line (-report-serving), which the previous
// release does not have.
func (u *upgrade) startServer(bin, name string, args []string) *proc {
	u.c.t.Helper()
	if bin == u.newBin {
		args = append(args[:len(args):len(args)], "-report-serving")
	}
	return u.c.startBin(bin, name, args...)
}

// clusterShards returns the shards every server runs a replica of, once
// they all run the same ones (3 servers, replication factor 3: each runs
// every shard, the meta shard included).
func (u *upgrade) clusterShards(servers []string) []uint64 {
	t := u.c.t
	t.Helper()
	var shards []uint64
	u.wait(30*time.Second, "every server to run a replica of every shard", func() bool {
		shards = nil
		for _, s := range servers {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			runs, err := u.probe.running(ctx, u.rpc[s])
			cancel()
			if err != nil || len(runs) == 0 || (shards != nil && !slices.Equal(runs, shards)) {
				return false
			}
			shards = runs
		}
		return true
	})
	t.Logf("every server runs replicas of shards %v", shards)
	return shards
}

// waitServing waits until server name, restarted, is back as
// docs/UPGRADING.md defines it before the next peer may be stopped: its
// replicas are caught up. With this tree's binary that is its serving line
// (Node.WaitServing returned: each lock shard answered a linearizable read
// through its own replica). For both releases it is also, asked from
// outside over lockmesh's RPC, the controller's own catch-up check on
// every shard it runs, the meta shard included (see replicaProbe): the
// previous release has no serving line, and WaitServing does not cover
// the meta shard.
func (u *upgrade) waitServing(name string) {
	t := u.c.t
	t.Helper()
	p := u.running[name]
	start := time.Now()
	if p.cmd.Path == u.newBin {
		u.wait(30*time.Second, name+" to print serving (Node.WaitServing returned)", func() bool { return u.serving[p] })
	}
	addr := u.rpc[name]
	stop := make(chan struct{})
	defer close(stop)
	caughtUp := make(chan struct{})
	var mu sync.Mutex
	var last replicaState
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			st := u.probe.state(addr, u.shards, 2*time.Second)
			mu.Lock()
			last = st
			mu.Unlock()
			if st.ok() {
				close(caughtUp)
				return
			}
			select { // asking again: a poll, not a wait for an event
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	defer func() {
		if t.Failed() {
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%s's replicas when the wait ended: %v", name, last)
		}
	}()
	u.wait(30*time.Second, name+"'s replicas of every shard to be caught up", func() bool {
		select {
		case <-caughtUp:
			return true
		default:
			return false
		}
	})
	t.Logf("%s (%s) serving, its replicas of shards %v caught up, %v after the wait began",
		name, u.bins[p.cmd.Path], u.shards, time.Since(start).Round(time.Millisecond))
}

// logReplicas logs, for each server, which of its replicas answer the
// catch-up check within 500ms: what the next stop leaves behind.
func (u *upgrade) logReplicas(servers []string, when string) {
	u.c.t.Helper()
	for _, s := range servers {
		u.c.t.Logf("%s: %s replicas %v", when, s, u.probe.state(u.rpc[s], u.shards, 500*time.Millisecond))
	}
}

// waitGrants waits until each key was granted n more times.
func (u *upgrade) waitGrants(n int, keys []string) {
	u.c.t.Helper()
	ph := u.phases[len(u.phases)-1]
	from := map[string]int{}
	for _, k := range keys {
		from[k] = ph.grants[k]
	}
	u.wait(30*time.Second, fmt.Sprintf("%d more grants of %v", n, keys), func() bool {
		for _, k := range keys {
			if ph.grants[k]-from[k] < n {
				return false
			}
		}
		return true
	})
}

// stop sends SIGTERM to name's process and waits for it to exit 0.
func (u *upgrade) stop(name string) {
	t := u.c.t
	t.Helper()
	p := u.running[name]
	u.expectExit[p] = true
	sent := time.Now()
	if !exited(p) {
		u.c.signal(p, syscall.SIGTERM)
	}
	u.c.until(20*time.Second, name+" to exit after SIGTERM", func() bool { return exited(p) })
	t.Logf("%s (%s) sent SIGTERM at %s, exited %v later", name, u.bins[p.cmd.Path], clock(sent), time.Since(sent).Round(time.Millisecond))
	if code := p.cmd.ProcessState.ExitCode(); code != 0 && !refusesLevel(p) {
		t.Fatalf("%s (%s) exited with %d after SIGTERM, want 0; its stderr, last lines:\n%s",
			name, u.bins[p.cmd.Path], code, p.stderr.tail(20))
	}
}

// report logs what each phase saw.
func (u *upgrade) report(keys []string) {
	t := u.c.t
	u.phase("") // ends the last one
	u.phases = u.phases[:len(u.phases)-1]
	var total int
	for _, ph := range u.phases {
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s %d grants (top token %d)", k, ph.grants[k], ph.maxTok[k]))
			total += ph.grants[k]
		}
		t.Logf("phase %-34q %6.1fs: %s; by client %v; %d leases lost, 0 failed calls",
			ph.name, ph.elapsed.Seconds(), strings.Join(parts, ", "), ph.byProc, ph.lost)
	}
	t.Logf("%d grants in all, every one checked for token order and overlap", total)
}

// refusesLevel reports whether p said on stderr that it does not speak the
// cluster's feature level.
func refusesLevel(p *proc) bool { return refusalLine(p) != "" }

func refusalLine(p *proc) string {
	for _, line := range strings.Split(p.stderr.tail(200), "\n") {
		if strings.Contains(line, "feature level") && (strings.Contains(line, "refus") || strings.Contains(line, "incompatible")) {
			return line
		}
	}
	return ""
}

// buildPrevious builds the previous release's peer program from the
// commit recorded in release.Previous, extracted with git archive into a
// temporary dir (no worktree is registered in the repository). The module
// cache is shared, so after the first run this takes seconds.
func buildPrevious(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("the cross-version test builds release %s from git history and needs git: %v", release.Previous, err)
	}
	if out, err := exec.Command("git", "cat-file", "-e", release.Previous+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s of the previous release (%s, internal/release.Previous) is not in this clone (%v: %s): "+
			"fetch the history (git fetch --unshallow, or actions/checkout with fetch-depth: 0) to run the cross-version test",
			release.Previous, release.PreviousVersion, err, bytes.TrimSpace(out))
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatalf("git rev-parse --show-toplevel: %v", err)
	}
	// From the top: in a subdirectory git archive takes only that one.
	archive := exec.Command("git", "archive", "--format=tar", release.Previous)
	archive.Dir = string(bytes.TrimSpace(top))
	extract := exec.Command("tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	extract.Stdin = pipe
	var archErr, extErr bytes.Buffer
	archive.Stderr, extract.Stderr = &archErr, &extErr
	if err := extract.Start(); err != nil {
		t.Fatalf("tar: %v", err)
	}
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive %s: %v: %s", release.Previous, err, archErr.String())
	}
	if err := extract.Wait(); err != nil {
		t.Fatalf("tar -x of release %s: %v: %s", release.Previous, err, extErr.String())
	}
	bin := filepath.Join(dir, "peer-previous")
	build := exec.Command("go", "build", "-o", bin, "./examples/peer")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the previous release %s: %v\n%s", release.Previous, err, out)
	}
	t.Logf("built the previous release %.7s in %v", release.Previous, time.Since(start).Round(time.Millisecond))
	return bin
}

// levelsOf asks bin which feature levels it speaks (-version). A previous
// release without the flag speaks what internal/release records for it.
func levelsOf(t *testing.T, bin string, previous bool) (lo, hi uint8) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "-version")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if previous && errors.As(err, &exit) && strings.Contains(stderr.String(), "flag provided but not defined: -version") {
		return uint8(release.PreviousMinLevel), uint8(release.PreviousMaxLevel)
	}
	if err != nil {
		t.Fatalf("%s -version: %v: %s", bin, err, stderr.String())
	}
	var v string
	if _, err := fmt.Sscanf(stdout.String(), "lockmesh %s levels=%d-%d", &v, &lo, &hi); err != nil {
		t.Fatalf("%s -version printed %q: %v", bin, stdout.String(), err)
	}
	return lo, hi
}

// TestVersionFlag checks what -version prints; the upgrade test reads the
// levels from it.
func TestVersionFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d; stderr %q", code, stderr.String())
	}
	lo, hi := node.FeatureLevels()
	if got, want := stdout.String(), fmt.Sprintf("lockmesh %s levels=%d-%d\n", release.Version, lo, hi); got != want {
		t.Errorf("-version printed %q, want %q", got, want)
	}
}

// flagValue returns the value that follows name in args.
func flagValue(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}
