package main

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

// The pause tests: a process that stops running without dying (SIGSTOP;
// a long GC, a VM migration, a laptop lid), while the others go on, and
// that then runs again (SIGCONT) with its old state, clocks and timers.

// pauseTTL is the pause tests' session TTL: a pause past it is quick. It
// is the shortest the peers accept at the default RTT (40 RTT, see
// node.Config.Validate); a shorter RTT would allow less, but would have
// the 48 Raft replicas of three peers on loopback hold elections
// whenever a busy machine delays a heartbeat.
const pauseTTL = 40 * node.DefaultRTT

// shardPause is how long TestFailoverPausedShardLeader stops the shard's
// Raft leader at least: past the Raft election timeout (10-20 RTT), so
// that the others elect a new one, and within the TTL. The stopped peer's
// Session may lapse all the same, on its own clock: its lease runs for
// the TTL less the margin (TTL/10) from its last acknowledged keepalive,
// which may have been sent a keepalive round (TTL/4) before the stop. It
// then campaigns again with a new Session.
const shardPause = 3 * time.Second

// shardSettled is how long the peers must agree on who leads the
// election's shard before TestFailoverPausedShardLeader stops it.
const shardSettled = 2 * time.Second

// pauseRound is what a pause test's round saw.
type pauseRound struct {
	ttl time.Duration
	// leader and term are the election's leader and its term when target
	// was stopped.
	leader string
	term   uint64
	// target is the child that was stopped; stopAt and contAt are when it
	// was sent SIGSTOP and SIGCONT, and stopIdx and contIdx how many lines
	// had been read then (events[stopIdx:] were read after the SIGSTOP).
	target           string
	stopAt, contAt   time.Time
	stopIdx, contIdx int
	// next is the observer's line of the first leader after target
	// (TestFailoverPausedLeader).
	next event
	// stopped is when the children were told to stop; events are every
	// line they printed, and pids their process ids.
	stopped time.Time
	events  []event
	pids    map[string]int
}

// TestFailoverPausedLeader stops the election leader's process
// (SIGSTOP) for longer than the session TTL, until the observer reports
// a new leader, then lets it run again (SIGCONT). The resumed process
// must find its leadership gone before it acts on it: it prints lost for
// its term and no leading line of that term after its successor was
// elected (see checkPausedLeader).
func TestFailoverPausedLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program and runs 4 processes for about 15s")
	}
	bin := buildProgram(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := runPausedLeader(ctx, roundOptions{bin: bin, dir: t.TempDir(), ttl: pauseTTL, rtt: node.DefaultRTT,
		election: defaultElection, echo: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	checkPausedLeader(t, r)
	checkStopped(t, r.events, r.pids)
	t.Logf("%s (term %d) stopped for %v; %s elected with term %d %v after the SIGSTOP (the observer's line)",
		r.target, r.term, r.contAt.Sub(r.stopAt).Round(time.Millisecond), r.next.value, r.next.term, r.next.at.Sub(r.stopAt).Round(time.Millisecond))
}

// TestFailoverPausedShardLeader stops the process that leads the Raft
// shard holding the election, while another leads the election, for
// shardPause: the other two elect a new Raft leader meanwhile. It then
// lets it run again, a deposed Raft leader that does not know it yet.
// Throughout, at most one peer may rely on the election's leadership, and
// terms must rise; the election must end with one leader, whom the
// observer names (see checkPausedShardLeader).
func TestFailoverPausedShardLeader(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program and runs 4 processes for about 15s")
	}
	bin := buildProgram(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := runPausedShardLeader(ctx, roundOptions{bin: bin, dir: t.TempDir(), ttl: pauseTTL, rtt: node.DefaultRTT,
		election: defaultElection, echo: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	checkPausedShardLeader(t, r)
	checkStopped(t, r.events, r.pids)
	last := lastObserved(r.events, r.stopped)
	t.Logf("%s, leading the election's shard, stopped for %v while %s led the election with term %d; at the end %s leads with term %d",
		r.target, r.contAt.Sub(r.stopAt).Round(time.Millisecond), r.leader, r.term, last.value, last.term)
}

// runPausedLeader starts three peers and an observer, waits for a leader
// with the two others queued, stops the leader's process until the
// observer reports a new leader and the TTL has passed, resumes it, and
// waits until it printed lost and queued again. It returns what it saw,
// also when it fails (with the error).
func runPausedLeader(ctx context.Context, o roundOptions) (r *pauseRound, err error) {
	f := newFleet(o)
	r = &pauseRound{ttl: o.ttl}
	defer func() {
		if r.stopped.IsZero() {
			r.stopped = time.Now()
		}
		r.events, r.pids, err = f.finish(ctx, err)
	}()
	if err := f.launch(ctx, o, "-report-leading", "100ms"); err != nil {
		return r, err
	}
	first, err := f.awaitLeader(ctx, "a first leader", 0, "")
	if err != nil {
		return r, err
	}
	r.leader, r.term, r.target = first.value, first.term, first.value
	if err := f.until(ctx, "the other candidates queued behind "+first.value, func() bool {
		return f.queuedSince(0, first.value) >= len(peerNames)-1
	}); err != nil {
		return r, err
	}
	victim, err := f.kid(first.value)
	if err != nil {
		return r, err
	}
	// Stop it just after it printed a leading line: it is idle then,
	// until its next tick, not between its check of the leadership and
	// its line (which it would print on waking, with the time of the
	// check: true, but after its successor's lines).
	if _, err := f.await(ctx, "a leading line of "+first.value, func(e event) bool {
		return e.kind == "leading" && e.from == first.value && e.term == first.term
	}); err != nil {
		return r, err
	}
	f.say("SIGSTOP to %s (pid %d), the leader: the cluster stops hearing from it, and it stops running", victim.name, victim.cmd.Process.Pid)
	if err := f.pause(r, victim); err != nil {
		return r, err
	}
	next, err := f.awaitLeader(ctx, "a leader after "+first.value+" was stopped", first.term, first.value)
	if err != nil {
		return r, err
	}
	r.next = next
	f.say("%s leads %v after the SIGSTOP (the observer's line), term %d -> %d", next.value, next.at.Sub(r.stopAt).Round(time.Millisecond), first.term, next.term)
	// Stopped past the TTL in any case.
	if err := f.readUntil(ctx, r.stopAt.Add(o.ttl+time.Second)); err != nil {
		return r, err
	}
	f.say("SIGCONT to %s, stopped for %v: its lease ran out meanwhile", victim.name, time.Since(r.stopAt).Round(time.Millisecond))
	if err := f.resume(r, victim); err != nil {
		return r, err
	}
	if err := f.untilWithin(ctx, 10*time.Second, victim.name+" to print lost", func() bool {
		return f.find(victim.name, "lost", first.term, r.contIdx) >= 0
	}); err != nil {
		return r, err
	}
	if err := f.untilWithin(ctx, 20*time.Second, victim.name+" to campaign again", func() bool {
		return f.find(victim.name, "queued", 0, r.contIdx) >= 0
	}); err != nil {
		return r, err
	}
	// A few more lines, for a late one of the old term to show among.
	if err := f.readUntil(ctx, time.Now().Add(500*time.Millisecond)); err != nil {
		return r, err
	}
	r.stopped = time.Now()
	f.say("stopping the children")
	return r, nil
}

// runPausedShardLeader starts three peers (each printing who leads the
// election's shard) and an observer, and waits for a leader with the two
// others queued, and until the cluster settled: the election has had a
// leader for a TTL, and the peers have agreed on the shard's Raft leader
// for shardSettled. If the election's leader leads the shard too, it
// resigns, until they differ. It stops the shard leader's process until
// the other two agree on a new shard leader and shardPause has passed,
// resumes it, and waits until the peers agree on the shard's leader
// again, the resumed peer queued again if its Session lapsed, and the
// election's leader has led for a second since. It returns what it saw,
// also when it fails (with the error).
func runPausedShardLeader(ctx context.Context, o roundOptions) (r *pauseRound, err error) {
	f := newFleet(o)
	r = &pauseRound{ttl: o.ttl}
	defer func() {
		if r.stopped.IsZero() {
			r.stopped = time.Now()
		}
		r.events, r.pids, err = f.finish(ctx, err)
	}()
	if err := f.launch(ctx, o, "-report-leading", "100ms", "-report-shard-leader", "100ms"); err != nil {
		return r, err
	}
	cur, err := f.awaitLeader(ctx, "a first leader", 0, "")
	if err != nil {
		return r, err
	}
	if err := f.until(ctx, "the other candidates queued behind "+cur.value, func() bool {
		return f.queuedSince(0, cur.value) >= len(peerNames)-1
	}); err != nil {
		return r, err
	}
	var target string
	for resigned := 0; ; resigned++ {
		// A cluster just formed is still settling: the leadership
		// balancer moves shard leaders, and the leases of sessions
		// opened while the shards elected their first leaders count
		// from the first try, so they may lapse at the first keepalive
		// that fails. Wait until the election has had a leader for a
		// TTL and the shard's leader has stayed the same for a while.
		var since time.Time
		if err := f.untilWithin(ctx, 30*time.Second, "the peers to agree on the leader of the election's shard for "+shardSettled.String(), func() bool {
			if l := f.agreedShardLeader(); l != target {
				target, since = l, time.Now()
			}
			settled := time.Now().After(firstElected(f.events).Add(o.ttl))
			return target != "" && time.Since(since) >= shardSettled && settled
		}); err != nil {
			return r, err
		}
		if target != cur.value {
			break
		}
		if resigned == 3 {
			return r, fmt.Errorf("%s leads the election and its shard after %d resignations", cur.value, resigned)
		}
		// Stopping it would be TestFailoverPausedLeader again: it
		// resigns, so that a candidate leads the shard.
		f.say("%s leads the election and its shard: SIGUSR1, so that it resigns", cur.value)
		k, err := f.kid(cur.value)
		if err != nil {
			return r, err
		}
		from := len(f.events)
		if err := k.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			return r, err
		}
		next, err := f.awaitLeader(ctx, "a leader after "+cur.value+" resigned", cur.term, "")
		if err != nil {
			return r, err
		}
		if err := f.until(ctx, cur.value+" queued again", func() bool { return f.find(cur.value, "queued", 0, from) >= 0 }); err != nil {
			return r, err
		}
		cur = next
	}
	r.leader, r.term, r.target = cur.value, cur.term, target
	victim, err := f.kid(target)
	if err != nil {
		return r, err
	}
	f.say("SIGSTOP to %s (pid %d), the Raft leader of the election's shard, for %v while %s leads the election", victim.name, victim.cmd.Process.Pid, shardPause, cur.value)
	if err := f.pause(r, victim); err != nil {
		return r, err
	}
	if err := f.untilWithin(ctx, 15*time.Second, "the others to agree on a new leader of the election's shard", func() bool {
		seen := map[string]string{}
		for _, e := range f.events[r.stopIdx:] {
			if e.kind == "shardleader" && e.from != target {
				seen[e.from] = e.peer
			}
		}
		leader := ""
		for _, p := range peerNames {
			if p == target {
				continue
			}
			s := seen[p]
			if s == "" || s == "none" || s == target || leader != "" && s != leader {
				return false
			}
			leader = s
		}
		return true
	}); err != nil {
		return r, err
	}
	if err := f.readUntil(ctx, r.stopAt.Add(shardPause)); err != nil {
		return r, err
	}
	f.say("SIGCONT to %s, stopped for %v", victim.name, time.Since(r.stopAt).Round(time.Millisecond))
	if err := f.resume(r, victim); err != nil {
		return r, err
	}
	if err := f.untilWithin(ctx, 20*time.Second, "the peers to agree on the shard's leader again", func() bool {
		return f.agreedShardLeader() != ""
	}); err != nil {
		return r, err
	}
	// Its Session may have lapsed while it was stopped (it found out on
	// waking): it campaigns again with a new one.
	if err := f.untilWithin(ctx, 20*time.Second, target+" to campaign again", func() bool {
		return f.find(target, "session-lost", 0, r.contIdx) < 0 || f.find(target, "queued", 0, r.contIdx) >= 0
	}); err != nil {
		return r, err
	}
	if err := f.untilWithin(ctx, 30*time.Second, "a leader that led for a second after "+target+" resumed", func() bool {
		last := lastObserved(f.events, time.Now())
		if last.kind != "leader" {
			return false
		}
		for _, e := range f.events[r.contIdx:] {
			if e.from == last.value && e.kind == "leading" && e.term == last.term && e.at.Sub(r.contAt) > time.Second {
				return true
			}
		}
		return false
	}); err != nil {
		return r, err
	}
	r.stopped = time.Now()
	f.say("stopping the children")
	return r, nil
}

// checkPausedLeader checks what the children of a runPausedLeader round
// printed: checkLeaderships (no leadership overlapped another, by the
// at= times: the resumed leader printed no leading line stamped after its
// successor's elected line), checkObserver (resyncs allowed), checkEnd,
// and:
//
//   - the leader after the pause has a higher term, and is another peer;
//   - the pause lasted past the TTL, and the cluster held the stopped
//     leader's session for at least half of it before electing another;
//   - once resumed, the stopped leader printed lost for its term, and,
//     in the order its lines were read, no leading line of that term
//     after its lost line, nor after its successor's elected line (but
//     one stamped before the SIGSTOP and in flight: it printed it on
//     waking, with the time it had checked its leadership).
func checkPausedLeader(t reporter, r *pauseRound) {
	t.Helper()
	elected := checkLeaderships(t, r.events)
	checkObserver(t, r.events, true)
	checkEnd(t, r.events, r.stopped, elected)
	if r.next.term <= r.term {
		t.Errorf("the leader after the pause, %s, has term %d, not above %s's %d", r.next.value, r.next.term, r.target, r.term)
	}
	if r.next.value == r.target {
		t.Errorf("the leader after the pause is %s, the one stopped", r.target)
	}
	if d := r.contAt.Sub(r.stopAt); d <= r.ttl {
		t.Errorf("%s was stopped for %v, not past the TTL of %v", r.target, d, r.ttl)
	}
	if e, ok := elected[r.next.term]; !ok {
		t.Errorf("%s printed no elected line of term %d, which the observer showed", r.next.value, r.next.term)
	} else if d := e.at.Sub(r.stopAt); d < r.ttl/2 {
		t.Errorf("%s was elected %v after %s was stopped: its session was not held for its TTL of %v", e.from, d, r.target, r.ttl)
	}
	lost, succeeded := -1, -1
	for i, e := range r.events {
		if e.kind == "elected" && e.term == r.next.term && succeeded < 0 {
			succeeded = i
		}
		if e.from != r.target || e.term != r.term {
			continue
		}
		switch e.kind {
		case "lost":
			if lost < 0 && i >= r.contIdx {
				lost = i
			}
		case "leading":
			if lost >= 0 {
				t.Errorf("%s printed %q after its lost line of term %d", e.from, e.text, r.term)
			}
			if succeeded >= 0 && !e.at.Before(r.stopAt) {
				t.Errorf("%s printed %q after %s's elected line of term %d, stamped after it was stopped at %v",
					e.from, e.text, r.next.value, r.next.term, r.stopAt.Format(time.StampMicro))
			}
		}
	}
	if lost < 0 {
		t.Errorf("%s printed no lost line for term %d after it was resumed", r.target, r.term)
	}
}

// checkPausedShardLeader checks what the children of a
// runPausedShardLeader round printed: checkLeaderships (at most one peer
// relied on the leadership at any time, and terms rose), checkObserver
// (resyncs allowed), checkEnd, and that the pause hit what it meant to:
// the stopped peer led the election's shard and not the election, and
// another peer saw a new leader of the shard before it was resumed.
func checkPausedShardLeader(t reporter, r *pauseRound) {
	t.Helper()
	elected := checkLeaderships(t, r.events)
	checkObserver(t, r.events, true)
	checkEnd(t, r.events, r.stopped, elected)
	if r.leader == r.target {
		t.Errorf("%s, the peer stopped, led the election too", r.target)
	}
	before := shardLeaders(r.events[:r.stopIdx])
	for _, p := range peerNames {
		if before[p] != r.target {
			t.Errorf("when %s was stopped, %s saw %q lead the election's shard", r.target, p, before[p])
		}
	}
	changed := false
	for _, e := range r.events[r.stopIdx:r.contIdx] {
		changed = changed || e.kind == "shardleader" && e.from != r.target && e.peer != r.target && e.peer != "none"
	}
	if !changed {
		t.Errorf("no peer saw a new leader of the election's shard while %s was stopped", r.target)
	}
}

// checkEnd checks that the election ended with one leader, whom the
// observer named: the last peer elected before the stop printed neither
// lost nor resigning for its term before the stop, and the observer's
// last line before the stop is a leader line of that peer and term.
func checkEnd(t reporter, events []event, stopped time.Time, elected map[uint64]event) {
	t.Helper()
	var last event
	for _, e := range elected {
		if e.at.Before(stopped) && e.term > last.term {
			last = e
		}
	}
	if last.term == 0 {
		t.Errorf("nobody was elected before the stop")
		return
	}
	for _, e := range events {
		if e.from == last.from && e.term == last.term && (e.kind == "lost" || e.kind == "resigning") && e.at.Before(stopped) {
			t.Errorf("the election ended without a leader: %s printed %q before the stop", e.from, e.text)
		}
	}
	if obs := lastObserved(events, stopped); obs.kind != "leader" || obs.term != last.term || obs.value != last.from {
		t.Errorf("the observer's last line before the stop is %q; the last peer elected was %s with term %d", obs.text, last.from, last.term)
	}
}

// firstElected returns the time of the first elected line among events,
// the zero time if there is none.
func firstElected(events []event) time.Time {
	for _, e := range events {
		if e.kind == "elected" {
			return e.at
		}
	}
	return time.Time{}
}

// lastObserved returns the observer's last leader or vacant line stamped
// before t.
func lastObserved(events []event, t time.Time) event {
	var last event
	for _, e := range events {
		if e.from == observerName && (e.kind == "leader" || e.kind == "vacant") && e.at.Before(t) {
			last = e
		}
	}
	return last
}

// shardLeaders returns whom each peer's last shardleader line among
// events named.
func shardLeaders(events []event) map[string]string {
	seen := map[string]string{}
	for _, e := range events {
		if e.kind == "shardleader" {
			seen[e.from] = e.peer
		}
	}
	return seen
}

// agreedShardLeader returns the leader of the election's shard that
// every peer's last shardleader line names, or "" if they differ or
// name none.
func (f *fleet) agreedShardLeader() string {
	seen := shardLeaders(f.events)
	leader := seen[peerNames[0]]
	for _, p := range peerNames {
		if seen[p] != leader {
			return ""
		}
	}
	if leader == "none" {
		return ""
	}
	return leader
}

// find returns the index in f.events, from since on, of the first line
// of kind by from, of term unless term is 0; -1 if there is none.
func (f *fleet) find(from, kind string, term uint64, since int) int {
	for i := since; i < len(f.events); i++ {
		if e := f.events[i]; e.from == from && e.kind == kind && (term == 0 || e.term == term) {
			return i
		}
	}
	return -1
}

// pause sends SIGSTOP to k and records when, in r.
func (f *fleet) pause(r *pauseRound, k *kid) error {
	r.stopIdx, r.stopAt = len(f.events), time.Now()
	if err := k.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP to %s: %w", k.name, err)
	}
	return nil
}

// resume sends SIGCONT to k and records when, in r.
func (f *fleet) resume(r *pauseRound, k *kid) error {
	r.contIdx, r.contAt = len(f.events), time.Now()
	if err := k.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT to %s: %w", k.name, err)
	}
	return nil
}

// untilWithin is until, bounded by d as well as ctx.
func (f *fleet) untilWithin(ctx context.Context, d time.Duration, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeoutCause(ctx, d, fmt.Errorf("not within %v", d))
	defer cancel()
	return f.until(ctx, what, cond)
}

// readUntil reads lines until the time t, or fails as await does: a
// child exits that was not stopped by the fleet, or ctx ends first.
func (f *fleet) readUntil(ctx context.Context, t time.Time) error {
	tctx, cancel := context.WithDeadline(ctx, t)
	defer cancel()
	_, err := f.await(tctx, "time to pass", func(event) bool { return false })
	if ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}
