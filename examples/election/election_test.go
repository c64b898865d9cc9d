package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/node"
)

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.role != roleDemo || cfg.election != defaultElection || cfg.measure != 0 || cfg.timeout != time.Minute ||
		cfg.node.SessionTTL != node.DefaultSessionTTL || cfg.node.RTT != node.DefaultRTT {
		t.Errorf("defaults: %+v", cfg)
	}
	if cfg, err = parseFlags([]string{"-measure", "5", "-timeout", "2m", "-ttl", "5s"}); err != nil || cfg.measure != 5 || cfg.timeout != 2*time.Minute || cfg.node.SessionTTL != 5*time.Second {
		t.Errorf("demo flags: %+v, %v", cfg, err)
	}

	base := []string{"-data", "/tmp/p1", "-gossip", "127.0.0.1:7001", "-raft", "127.0.0.1:7002", "-rpc", "127.0.0.1:7003"}
	with := func(extra ...string) []string { return append(slices.Clone(base), extra...) }
	cfg, err = parseFlags(with("-role", "peer", "-name", "p1", "-expect", "3", "-join", "127.0.0.1:7011, 127.0.0.1:7021,",
		"-election", "election/x", "-report-leading", "50ms", "-report-shard-leader", "100ms", "-log-level", "debug"))
	if err != nil {
		t.Fatal(err)
	}
	if nc := cfg.node; nc.Name != "p1" || nc.DataDir != "/tmp/p1" || nc.BootstrapExpect != 3 || strings.Join(nc.Join, " ") != "127.0.0.1:7011 127.0.0.1:7021" || nc.NoReplicas {
		t.Errorf("peer: %+v", nc)
	}
	if cfg.role != rolePeer || cfg.election != "election/x" || cfg.reportLeading != 50*time.Millisecond ||
		cfg.reportShardLeader != 100*time.Millisecond || cfg.logLevel.String() != "DEBUG" {
		t.Errorf("peer: %+v", cfg)
	}
	if cfg, err = parseFlags(with("-role", "observer", "-join", "127.0.0.1:7011")); err != nil || !cfg.node.NoReplicas {
		t.Errorf("observer: NoReplicas %v, err %v; want it set and no error", cfg.node.NoReplicas, err)
	}

	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"-data", "/tmp/x"}, "-data: not a flag of the demo"},
		{[]string{"-measure", "-1"}, "-measure"},
		{[]string{"-timeout", "0s"}, "-timeout"},
		{[]string{"-ttl", "1s"}, "SessionTTL"},
		{[]string{"-role", "boss"}, `-role "boss"`},
		{[]string{"-election", ""}, "-election"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{with("-role", "peer", "-expect", "3", "-measure", "3"), "-measure: a flag of the demo only"},
		{with("-role", "peer"), "-expect"},
		{with("-role", "observer"), "needs -join"},
		{with("-role", "observer", "-expect", "3", "-join", "127.0.0.1:7011"), "no -expect"},
		{with("-role", "observer", "-join", "127.0.0.1:7011", "-report-leading", "1s"), "-report-leading"},
		{with("-role", "peer", "-expect", "3", "-report-leading", "-1s"), "-report-leading"},
		{with("-role", "observer", "-join", "127.0.0.1:7011", "-report-shard-leader", "1s"), "-report-shard-leader is for -role peer"},
		{with("-role", "peer", "-expect", "3", "-report-shard-leader", "-1s"), "-report-shard-leader"},
		{with("-role", "peer", "-expect", "3", "-log-level", "loud"), "-log-level"},
		{with("-role", "peer", "-expect", "3", "-raft", "127.0.0.1:0"), "fixed port"},
		{[]string{"-role", "peer", "-expect", "3"}, "-data"},
	} {
		_, err := parseFlags(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%q) = %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
	if _, err := parseFlags([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

// TestRunRejectsBadFlags checks the exit code and message a user sees; it
// starts nothing.
func TestRunRejectsBadFlags(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"-ttl", "soon"}, &stdout, &stderr); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), `invalid value "soon" for flag -ttl`) {
		t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "-role") {
		t.Errorf("-h: exit code %d, usage %q", code, stderr.String())
	}
}

func TestParseLine(t *testing.T) {
	at := time.Unix(0, 1700000000123456789)
	for _, tc := range []struct {
		line string
		want event
	}{
		{"leader term=7 value=p2 index=123 at=1700000000123456789", event{kind: "leader", term: 7, value: "p2", index: 123, at: at}},
		{"resync vacant index=130 at=1700000000123456789", event{kind: "vacant", resync: true, index: 130, at: at}},
		{"lost term=7 peer=p2 at=1700000000123456789 err=lockmesh: lease expired term=9", event{kind: "lost", term: 7, peer: "p2", at: at}},
		{"queued peer=p3 place=2 at=1700000000123456789", event{kind: "queued", peer: "p3", place: 2, at: at}},
		{"shardleader shard=12 peer=p1 at=1700000000123456789", event{kind: "shardleader", shard: 12, peer: "p1", at: at}},
	} {
		got := parse("x", tc.line, time.Time{})
		tc.want.from, tc.want.text = "x", tc.line
		if got != tc.want {
			t.Errorf("parse(%q) = %+v, want %+v", tc.line, got, tc.want)
		}
	}
}

// TestFailover builds the program and runs the demo's scenario once with
// real processes on loopback, at the default session TTL and RTT: three
// peers campaign, the first leader resigns (SIGUSR1), the second is
// killed (SIGKILL), an observer process prints every change of leader.
// It checks what the children printed (see checkRound) and that every
// child is gone afterwards.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the program and runs 4 processes for about 15s")
	}
	bin := buildProgram(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	r, err := runRound(ctx, roundOptions{bin: bin, dir: t.TempDir(), ttl: node.DefaultSessionTTL, rtt: node.DefaultRTT,
		election: defaultElection, echo: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	checkRound(t, r, node.DefaultSessionTTL)
	checkStopped(t, r.events, r.pids)
	t.Logf("resignation: %s elected %v after %s was signalled; crash: %s elected %v after %s was killed",
		r.leaders[1], r.handover.Round(time.Millisecond), r.leaders[0], r.leaders[2], r.failover.Round(time.Millisecond), r.leaders[1])
}

// TestFailoverMeasure repeats TestFailover's scenario, each round on a
// fresh cluster, and logs the median and worst failover. It runs only
// when LOCKMESH_ELECTION_ROUNDS says how many rounds (at least 5), as:
//
//	LOCKMESH_ELECTION_ROUNDS=5 go test ./examples/election/ -run TestFailoverMeasure -count=1 -v
func TestFailoverMeasure(t *testing.T) {
	env := os.Getenv("LOCKMESH_ELECTION_ROUNDS")
	if env == "" {
		t.Skip("set LOCKMESH_ELECTION_ROUNDS=N (N >= 5) to measure failover over N rounds")
	}
	n, err := strconv.Atoi(env)
	if err != nil || n < 5 {
		t.Fatalf("LOCKMESH_ELECTION_ROUNDS=%q: want a number of rounds, at least 5", env)
	}
	bin := buildProgram(t)
	var out bytes.Buffer
	rounds, err := measure(context.Background(), roundOptions{bin: bin, ttl: node.DefaultSessionTTL, rtt: node.DefaultRTT, election: defaultElection},
		t.TempDir(), n, 90*time.Second, &out)
	t.Logf("rounds:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	var failover []time.Duration
	for i, r := range rounds {
		t.Run(strconv.Itoa(i+1), func(t *testing.T) {
			checkRound(t, r, node.DefaultSessionTTL)
			checkStopped(t, r.events, r.pids)
		})
		failover = append(failover, r.failover)
	}
	t.Logf("failover over %d rounds at session TTL %v: median %v, worst %v, best %v", n, node.DefaultSessionTTL,
		median(failover).Round(time.Millisecond), slices.Max(failover).Round(time.Millisecond), slices.Min(failover).Round(time.Millisecond))
}

// checkRound checks what the children of a round printed:
//
//   - terms rose: each leader's term above the one before, and the leader
//     after the crash is neither the killed one nor, since the resigned
//     leader queued again behind the third peer, the resigned one;
//   - candidates were elected in FIFO order: the next leader after the
//     resignation is the one that had printed place=1;
//   - the observer printed every change, in index order: its leader lines
//     until the children were stopped are exactly the peers' elected
//     lines until then, in term order (vacancies in between allowed),
//     with no resync and no observation that ended;
//   - no leadership overlapped its successor's, and terms rose in the
//     order the peers were elected (checkLeaderships);
//   - the crashed leader's leadership lasted until its session could
//     lapse (at least half the TTL), while a resignation handed over at
//     once (well within half the TTL).
func checkRound(t reporter, r *round, ttl time.Duration) {
	t.Helper()
	if !(r.terms[0] < r.terms[1] && r.terms[1] < r.terms[2]) {
		t.Errorf("terms %v of leaders %v do not rise", r.terms, r.leaders)
	}
	if r.leaders[1] == r.leaders[0] || r.leaders[2] == r.leaders[1] || r.leaders[2] == r.leaders[0] {
		t.Errorf("leaders %v: want three different peers (the resigned leader queued again behind the third)", r.leaders)
	}

	byTerm := checkLeaderships(t, r.events)
	var elected []event
	for _, e := range byTerm {
		if e.at.Before(r.stopped) {
			elected = append(elected, e)
		}
	}

	// FIFO: the place=1 candidate before the resignation was elected.
	var head string
	for _, e := range r.events {
		if e.kind == "queued" && e.place == 1 && e.at.Before(r.asked) {
			head = e.from
		}
	}
	if head != r.leaders[1] {
		t.Errorf("after %s resigned, %s was elected; %s was first in the queue", r.leaders[0], r.leaders[1], head)
	}

	// The observer: index order, term order, and every change.
	seen := checkObserver(t, r.events, false)
	slices.SortFunc(elected, func(a, b event) int { return cmp.Compare(a.term, b.term) })
	var want, got []string
	for _, e := range elected {
		want = append(want, e.from+"@"+strconv.FormatUint(e.term, 10))
	}
	for _, e := range seen {
		if e.at.Before(r.stopped) {
			got = append(got, e.value+"@"+strconv.FormatUint(e.term, 10))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("the observer saw leaders %v (value@term) before the stop; the peers printed elected %v", got, want)
	}
	if len(want) != 3 {
		t.Errorf("peers printed %d elected lines before the stop, want 3 (the first leader, after its resignation, after the crash): %v", len(want), want)
	}

	if r.failover < ttl/2 {
		t.Errorf("%s was elected %v after %s was killed: its session was not held for its TTL of %v", r.leaders[2], r.failover, r.leaders[1], ttl)
	}
	if r.handover > ttl/2 {
		t.Errorf("%s was elected %v after %s was asked to resign: a resignation hands over at once", r.leaders[1], r.handover, r.leaders[0])
	}
}

// checkLeaderships checks the peers' elected and leading lines among
// events, and returns the elected line of each term:
//
//   - no term was elected twice, and nobody printed a leading line of a
//     term it was not elected with;
//   - terms rose in the order of the elected lines' at= times;
//   - no leadership overlapped its successor's: no peer printed a leading
//     (or elected) line of a term later than another's elected line of a
//     higher term.
//
// A leading line's at= is read before the peer found its leadership
// held, so the peer did rely on it then: a leading line of a term later
// than the next term's elected line is two leaders at once.
func checkLeaderships(t reporter, events []event) map[uint64]event {
	t.Helper()
	elected := map[uint64]event{}
	reliance := map[uint64][2]time.Time{} // term: first elected, last relied on
	var order []event
	for _, e := range events {
		switch e.kind {
		case "elected":
			if p, dup := elected[e.term]; dup {
				t.Errorf("%s and %s were both elected with term %d", p.from, e.from, e.term)
				continue
			}
			elected[e.term] = e
			reliance[e.term] = [2]time.Time{e.at, e.at}
			order = append(order, e)
		case "leading":
			iv, ok := reliance[e.term]
			if !ok || elected[e.term].from != e.from {
				t.Errorf("%s printed %q without being elected with that term", e.from, e.text)
				continue
			}
			if e.at.After(iv[1]) {
				iv[1] = e.at
				reliance[e.term] = iv
			}
		}
	}
	slices.SortStableFunc(order, func(a, b event) int { return a.at.Compare(b.at) })
	for i := 1; i < len(order); i++ {
		if order[i].term <= order[i-1].term {
			t.Errorf("%s was elected with term %d at %v, after %s with term %d at %v: terms do not rise",
				order[i].from, order[i].term, order[i].at.Format(time.StampMicro), order[i-1].from, order[i-1].term, order[i-1].at.Format(time.StampMicro))
		}
	}
	for a, ia := range reliance {
		for b, ib := range reliance {
			if a < b && ia[1].After(ib[0]) {
				t.Errorf("%s relied on term %d until %v, after %s was elected with term %d at %v",
					elected[a].from, a, ia[1].Format(time.StampMicro), elected[b].from, b, ib[0].Format(time.StampMicro))
			}
		}
	}
	return elected
}

// checkObserver checks the observer's lines among events: indexes rise,
// and so do the terms of its leader lines. It returns the leader lines.
// With resyncs false, a resync or an observation that ended is an error
// too; with it true, each is allowed (the state read again may be at the
// index and term of the last line: nothing changed), but never a step
// back.
func checkObserver(t reporter, events []event, resyncs bool) []event {
	t.Helper()
	var seen []event
	var last *event
	for _, e := range events {
		if e.from != observerName {
			continue
		}
		switch e.kind {
		case "leader", "vacant":
		case "observe-ended":
			if !resyncs {
				t.Errorf("the observation ended: %q", e.text)
			}
			continue
		default:
			continue
		}
		if e.resync && !resyncs {
			t.Errorf("the observer resynced: %q", e.text)
		}
		if last != nil && (e.index < last.index || e.index == last.index && !e.resync) {
			t.Errorf("the observer printed index %d after %d: %q after %q", e.index, last.index, e.text, last.text)
		}
		last = &e
		if e.kind != "leader" {
			continue
		}
		if n := len(seen); n > 0 && (e.term < seen[n-1].term || e.term == seen[n-1].term && !e.resync) {
			t.Errorf("the observer printed term %d after term %d", e.term, seen[n-1].term)
		}
		seen = append(seen, e)
	}
	return seen
}

// checkStopped checks that every child of a round (pids, by name)
// exited, as its events say, and that its process is gone.
func checkStopped(t *testing.T, events []event, pids map[string]int) {
	t.Helper()
	exited := map[string]bool{}
	for _, e := range events {
		if e.kind == "exited" {
			exited[e.from] = true
		}
	}
	for name, pid := range pids {
		if !exited[name] {
			t.Errorf("%s (pid %d) was not seen to exit", name, pid)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) is still there: kill -0 says %v", name, pid, err)
		}
	}
	if len(pids) != len(peerNames)+1 {
		t.Errorf("%d children, want %d", len(pids), len(peerNames)+1)
	}
}

// reporter is what checkRound needs of a *testing.T.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// recorder is a reporter that keeps the errors.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestCheckRoundCatches feeds checkRound a made-up round that passes, and
// the same round broken in each way it must catch.
func TestCheckRoundCatches(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ms := time.Millisecond
	ev := func(from, text string, when time.Duration) event { return parse(from, text, at(when)) }
	line := func(from, format string, when time.Duration, args ...any) event {
		return ev(from, fmt.Sprintf(format, args...)+fmt.Sprintf(" at=%d", at(when).UnixNano()), when)
	}
	good := func() *round {
		return &round{
			leaders: [3]string{"p2", "p3", "p1"}, terms: [3]uint64{1, 2, 3},
			handover: 2 * ms, failover: 11 * time.Second,
			asked: at(3000 * ms), killed: at(4000 * ms), stopped: at(15100 * ms),
			events: []event{
				line(observerName, "vacant index=5", 1000*ms),
				line("p2", "elected term=1 peer=p2", 2000*ms),
				line(observerName, "leader term=1 value=p2 index=7", 2001*ms),
				line("p3", "queued peer=p3 place=1", 2200*ms),
				line("p1", "queued peer=p1 place=2", 2300*ms),
				line("p2", "leading term=1 peer=p2", 2900*ms),
				line("p2", "resigning term=1 peer=p2", 3000*ms),
				line("p3", "elected term=2 peer=p3", 3002*ms),
				line(observerName, "leader term=2 value=p3 index=12", 3002*ms),
				line("p2", "queued peer=p2 place=2", 3020*ms),
				line("p3", "leading term=2 peer=p3", 3900*ms),
				ev("p3", "exited: signal: killed", 4001*ms),
				line("p1", "elected term=3 peer=p1", 15000*ms),
				line(observerName, "leader term=3 value=p1 index=14", 15000*ms),
				line("p1", "leading term=3 peer=p1", 15050*ms),
				line("p1", "resigning term=3 peer=p1", 15100*ms),
				// After the stop: a peer may be elected that the
				// observer, stopping too, does not see.
				line("p2", "elected term=4 peer=p2", 15110*ms),
			},
		}
	}
	rec := &recorder{}
	checkRound(rec, good(), 10*time.Second)
	if len(rec.errs) > 0 {
		t.Fatalf("the good round fails: %q", rec.errs)
	}
	replace := func(events []event, i int, from, text string) {
		events[i] = parse(from, text+fmt.Sprintf(" at=%d", events[i].at.UnixNano()), events[i].at)
	}
	for _, tc := range []struct {
		name  string
		spoil func(*round)
		want  string // in an error
	}{
		{"terms fall", func(r *round) { r.terms[2] = 1 }, "do not rise"},
		{"observer skips a leader", func(r *round) {
			r.events = slices.Delete(r.events, 8, 9)
		}, "the observer saw leaders [p2@1 p1@3]"},
		{"observer out of index order", func(r *round) {
			replace(r.events, 8, observerName, "leader term=2 value=p3 index=6")
		}, "printed index 6 after 7"},
		{"observer resyncs", func(r *round) {
			replace(r.events, 8, observerName, "resync leader term=2 value=p3 index=12")
		}, "resynced"},
		{"a leader relies on its term after the next is elected", func(r *round) {
			r.events[5].at = at(3003 * ms)
		}, "p2 relied on term 1 until"},
		{"a term elected twice", func(r *round) {
			replace(r.events, 12, "p1", "elected term=2 peer=p1")
		}, "both elected with term 2"},
		{"a lower term elected later", func(r *round) {
			r.events[7].at = at(15001 * ms)
		}, "elected with term 2 at"},
		{"not FIFO", func(r *round) {
			r.events[3].from, r.events[4].from = "p1", "p3"
		}, "p1 was first in the queue"},
		{"the crashed leader's session dropped at once", func(r *round) { r.failover = time.Second }, "not held for its TTL"},
		{"a resignation that waits", func(r *round) { r.handover = 6 * time.Second }, "hands over at once"},
	} {
		r := good()
		tc.spoil(r)
		rec := &recorder{}
		checkRound(rec, r, 10*time.Second)
		if !slices.ContainsFunc(rec.errs, func(e string) bool { return strings.Contains(e, tc.want) }) {
			t.Errorf("%s: errors %q, want one with %q", tc.name, rec.errs, tc.want)
		}
	}

	// TestFailoverPausedLeader's round: p2 leads with term 1, is stopped
	// at 2.901s, p3 is elected with term 2 at 9s, p2 is resumed at 9.5s.
	pausedLeader := func() *pauseRound {
		return &pauseRound{
			ttl: 4 * time.Second, leader: "p2", term: 1, target: "p2",
			stopAt: at(2901 * ms), stopIdx: 6, contAt: at(9500 * ms), contIdx: 9, stopped: at(10000 * ms),
			next: line(observerName, "leader term=2 value=p3 index=12", 9001*ms),
			events: []event{
				line(observerName, "vacant index=5", 1000*ms),
				line("p2", "elected term=1 peer=p2", 2000*ms),
				line(observerName, "leader term=1 value=p2 index=7", 2001*ms),
				line("p3", "queued peer=p3 place=1", 2200*ms),
				line("p1", "queued peer=p1 place=2", 2300*ms),
				line("p2", "leading term=1 peer=p2", 2900*ms),
				// SIGSTOP to p2.
				line("p3", "elected term=2 peer=p3", 9000*ms),
				line(observerName, "leader term=2 value=p3 index=12", 9001*ms),
				line("p3", "leading term=2 peer=p3", 9100*ms),
				// SIGCONT to p2.
				line("p2", "lost term=1 peer=p2", 9501*ms),
				ev("p2", "session-lost peer=p2 err=lockmesh: lease expired", 9502*ms),
				ev("p2", "candidate peer=p2 session=5", 9503*ms),
				line("p2", "queued peer=p2 place=2", 9700*ms),
				line("p3", "leading term=2 peer=p3", 9800*ms),
				// The stop.
				line("p3", "resigning term=2 peer=p3", 10001*ms),
				line("p1", "elected term=3 peer=p1", 10002*ms),
			},
		}
	}
	// TestFailoverPausedShardLeader's round: p2 leads the shard and p3
	// the election with term 1; p2 is stopped at 3s, p1 leads the shard
	// from 4.5s, p2 is resumed at 6s.
	pausedShardLeader := func() *pauseRound {
		return &pauseRound{
			ttl: 4 * time.Second, leader: "p3", term: 1, target: "p2",
			stopAt: at(3000 * ms), stopIdx: 12, contAt: at(6000 * ms), contIdx: 16, stopped: at(7500 * ms),
			events: []event{
				line("p1", "shardleader shard=6 peer=none", 500*ms),
				line("p2", "shardleader shard=6 peer=none", 500*ms),
				line("p3", "shardleader shard=6 peer=none", 500*ms),
				line(observerName, "vacant index=5", 1000*ms),
				line("p1", "shardleader shard=6 peer=p2", 1500*ms),
				line("p2", "shardleader shard=6 peer=p2", 1500*ms),
				line("p3", "shardleader shard=6 peer=p2", 1500*ms),
				line("p3", "elected term=1 peer=p3", 2000*ms),
				line(observerName, "leader term=1 value=p3 index=7", 2001*ms),
				line("p1", "queued peer=p1 place=1", 2200*ms),
				line("p2", "queued peer=p2 place=2", 2300*ms),
				line("p3", "leading term=1 peer=p3", 2900*ms),
				// SIGSTOP to p2.
				line("p3", "shardleader shard=6 peer=none", 4200*ms),
				line("p1", "shardleader shard=6 peer=p1", 4500*ms),
				line("p3", "shardleader shard=6 peer=p1", 4510*ms),
				line("p3", "leading term=1 peer=p3", 5000*ms),
				// SIGCONT to p2.
				line("p2", "shardleader shard=6 peer=p1", 6100*ms),
				line("p3", "leading term=1 peer=p3", 7100*ms),
				// The stop.
				line("p3", "resigning term=1 peer=p3", 7501*ms),
				line("p1", "elected term=2 peer=p1", 7502*ms),
			},
		}
	}
	insert := func(r *pauseRound, i int, e event) {
		r.events = slices.Insert(r.events, i, e)
		if i <= r.stopIdx {
			r.stopIdx++
		}
		if i <= r.contIdx {
			r.contIdx++
		}
	}
	for _, tc := range []struct {
		name  string
		check func(reporter, *pauseRound)
		round func() *pauseRound
		spoil func(*pauseRound)
		want  string // in an error; "" for none at all
	}{
		{"paused leader: the good round", checkPausedLeader, pausedLeader, func(*pauseRound) {}, ""},
		{"paused leader: a leading line in flight at the SIGSTOP", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			insert(r, 8, line("p2", "leading term=1 peer=p2", 2900*ms+500*time.Microsecond))
		}, ""},
		{"paused leader: an observer that resynced", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			replace(r.events, 7, observerName, "resync leader term=2 value=p3 index=12")
		}, ""},
		{"paused leader: it leads on waking", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			insert(r, 10, line("p2", "leading term=1 peer=p2", 9501*ms))
		}, "p2 relied on term 1 until"},
		{"paused leader: a leading line after its lost line", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			insert(r, 10, line("p2", "leading term=1 peer=p2", 2800*ms))
		}, "after its lost line of term 1"},
		{"paused leader: a leading line after its successor's, stamped while stopped", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			insert(r, 8, line("p2", "leading term=1 peer=p2", 5000*ms))
		}, "stamped after it was stopped"},
		{"paused leader: no lost line", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			r.events = slices.Delete(r.events, 9, 10)
		}, "printed no lost line for term 1"},
		{"paused leader: the next term is not higher", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			r.next.term = 1
		}, "not above p2's 1"},
		{"paused leader: resumed within the TTL", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			r.contAt = at(5000 * ms)
		}, "not past the TTL"},
		{"paused leader: its session dropped at once", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			r.events[6].at = at(3500 * ms)
		}, "not held for its TTL"},
		{"paused leader: the observer shows another leader at the end", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			replace(r.events, 7, observerName, "leader term=2 value=p1 index=12")
		}, "the observer's last line before the stop"},
		{"paused leader: the observer's indexes fall", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			replace(r.events, 7, observerName, "leader term=2 value=p3 index=6")
		}, "printed index 6 after 7"},
		{"paused leader: no leader at the end", checkPausedLeader, pausedLeader, func(r *pauseRound) {
			replace(r.events, 13, "p3", "lost term=2 peer=p3 err=lockmesh: lease expired")
		}, "the election ended without a leader"},

		{"paused shard leader: the good round", checkPausedShardLeader, pausedShardLeader, func(*pauseRound) {}, ""},
		{"paused shard leader: two leaders at once", checkPausedShardLeader, pausedShardLeader, func(r *pauseRound) {
			insert(r, 15, line("p1", "elected term=2 peer=p1", 4600*ms))
		}, "p3 relied on term 1 until"},
		{"paused shard leader: terms fall", checkPausedShardLeader, pausedShardLeader, func(r *pauseRound) {
			replace(r.events, 7, "p3", "elected term=3 peer=p3")
			replace(r.events, 8, observerName, "leader term=3 value=p3 index=7")
		}, "elected with term 2 at"},
		{"paused shard leader: no new shard leader during the pause", checkPausedShardLeader, pausedShardLeader, func(r *pauseRound) {
			for _, i := range []int{12, 13, 14} {
				replace(r.events, i, r.events[i].from, "shardleader shard=6 peer=p2")
			}
		}, "no peer saw a new leader"},
		{"paused shard leader: it did not lead the shard", checkPausedShardLeader, pausedShardLeader, func(r *pauseRound) {
			replace(r.events, 6, "p3", "shardleader shard=6 peer=p3")
		}, `p3 saw "p3" lead the election's shard`},
		{"paused shard leader: it led the election too", checkPausedShardLeader, pausedShardLeader, func(r *pauseRound) {
			r.leader = "p2"
		}, "led the election too"},
		{"paused shard leader: the observer saw nobody at the end", checkPausedShardLeader, pausedShardLeader, func(r *pauseRound) {
			insert(r, 17, line(observerName, "vacant index=20", 6500*ms))
		}, "the observer's last line before the stop"},
	} {
		r := tc.round()
		tc.spoil(r)
		rec := &recorder{}
		tc.check(rec, r)
		switch {
		case tc.want == "" && len(rec.errs) > 0:
			t.Errorf("%s: errors %q, want none", tc.name, rec.errs)
		case tc.want != "" && !slices.ContainsFunc(rec.errs, func(e string) bool { return strings.Contains(e, tc.want) }):
			t.Errorf("%s: errors %q, want one with %q", tc.name, rec.errs, tc.want)
		}
	}
}

// buildProgram builds the program into a temporary dir.
func buildProgram(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "election")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// testWriter logs each line written to it.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
