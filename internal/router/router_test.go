package router

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const shard = layout.FirstLockShard

// fakeHost is a peer with a scripted local replica: propose answers each
// batch with f (called with the batch's commands), after gate lets it.
type fakeHost struct {
	p      *layout.Placement
	hosted bool
	leader uint64 // replica id the local replica reports, 0 for none

	mu      sync.Mutex
	batches [][]lockfsm.Command
	propose func(cmds []lockfsm.Command) ([]lockfsm.Result, error)
	gate    chan struct{} // when set, local proposals wait for it to close
	waiting int           // local proposals waiting at gate
	// keepAlive, when set, serves keepalives this peer sends itself.
	keepAlive func(ctx context.Context, req KeepAliveRequest) (KeepAliveResponse, error)
	// read, when set, answers reads on the local replica.
	read func(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error)
}

func (h *fakeHost) Placement() *layout.Placement { return h.p }
func (h *fakeHost) Hosts(uint64) bool            { return h.hosted }
func (h *fakeHost) Addr(name string) (string, bool) {
	return "addr-" + name, true
}
func (h *fakeHost) TopLevel() level.Level { return level.Tagged }
func (h *fakeHost) Authorize(_ context.Context, _ uint64, cmds []lockfsm.Command) error {
	for _, c := range cmds {
		if c.Op == lockfsm.OpLeaderTerm {
			return errors.New("refused by the host")
		}
	}
	return nil
}
func (h *fakeHost) ServeKeepAlive(ctx context.Context, req KeepAliveRequest) (KeepAliveResponse, error) {
	if h.keepAlive == nil {
		return KeepAliveResponse{}, errors.New("no local keepalives in this test")
	}
	return h.keepAlive(ctx, req)
}
func (h *fakeHost) ReadLocal(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	if h.read == nil {
		return replica.Answer{}, errors.New("no local reads in this test")
	}
	return h.read(ctx, shard, q)
}
func (h *fakeHost) LocalLeader(uint64) (uint64, bool) {
	return h.leader, h.leader != 0
}

func (h *fakeHost) ProposeLocal(ctx context.Context, _ uint64, data []byte) ([]lockfsm.Result, error) {
	if h.gate != nil {
		h.mu.Lock()
		h.waiting++
		h.mu.Unlock()
		select {
		case <-h.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	cmds, err := lockfsm.DecodeCommands(data)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.batches = append(h.batches, cmds)
	f := h.propose
	h.mu.Unlock()
	if f == nil {
		return grantAll(cmds), nil
	}
	return f(cmds)
}

func (h *fakeHost) batchSizes() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []int
	for _, b := range h.batches {
		out = append(out, len(b))
	}
	return out
}

// grantAll answers each acquire with a token equal to its request id.
func grantAll(cmds []lockfsm.Command) []lockfsm.Result {
	out := make([]lockfsm.Result, len(cmds))
	for i, c := range cmds {
		out[i] = lockfsm.Result{Status: lockfsm.StatusGranted, Token: c.Req}
	}
	return out
}

// fakePeers answers calls by address with f.
type fakePeers struct {
	mu    sync.Mutex
	calls []string
	f     func(addr string, body []byte) ([]byte, error)
}

func (p *fakePeers) Call(_ context.Context, addr string, _ uint8, body []byte) ([]byte, error) {
	p.mu.Lock()
	p.calls = append(p.calls, addr)
	p.mu.Unlock()
	return p.f(addr, body)
}

func (p *fakePeers) called() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

// threePeers is a layout of a, b and c, each hosting every shard.
// threePeers is a layout of a, b and c at level 2, which writes
// FormatTagged and neither caps sessions nor carries traces.
func threePeers() *layout.Placement {
	p := layout.New(1, 2, 3, layout.KeySchemeHashTag, []layout.Peer{{Name: "a"}, {Name: "b"}, {Name: "c"}})
	p.Level = uint32(level.Tagged)
	return p
}

func newTestRouter(t *testing.T, h Host, peers Caller) *Router {
	t.Helper()
	if peers == nil {
		peers = &fakePeers{f: func(string, []byte) ([]byte, error) { return nil, errors.New("no peers in this test") }}
	}
	r := New(Config{Name: "a", RTT: time.Millisecond, Peers: peers, ProposeMethod: 1}, h)
	t.Cleanup(r.Close)
	return r
}

func acquire(req uint64) lockfsm.Command {
	return lockfsm.Command{Op: lockfsm.OpAcquire, Session: 1, Req: req, Ack: 1, Key: fmt.Sprint("k", req), Limit: 1}
}

// Commands that queue while the shard's proposals are in flight go out
// together in one entry, and each gets its own result back.
func TestCommandsQueuedMeanwhileShareOneEntry(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, hosted: true, leader: a, gate: make(chan struct{})}
	r := newTestRouter(t, h, nil)
	ctx := context.Background()

	first := fillInflight(t, r, h)
	// These wait for a slot, so they are batched together: the batcher
	// holds what was queued when it started waiting for a slot, and takes
	// the rest when that batch goes out.
	const queued = 50
	var rest []*RequestState
	for i := range queued {
		rs, err := r.Propose(ctx, shard, acquire(uint64(100+i)))
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, rs)
	}
	close(h.gate)
	for i, rs := range append(first, rest...) {
		o := <-rs.ResultC()
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		if want := rs.cmds[0].Req; o.Result.Token != want {
			t.Fatalf("command %d got token %d, want its own result %d", i, o.Result.Token, want)
		}
	}
	sizes := h.batchSizes()
	sum := 0
	for _, n := range sizes {
		sum += n
	}
	if sum != maxInflightLocal+queued || len(sizes) > maxInflightLocal+2 {
		t.Fatalf("batch sizes %v: want %d commands in at most %d entries", sizes, maxInflightLocal+queued, maxInflightLocal+2)
	}
}

// A command whose outcome is unknown is sent again unchanged, and Apply
// returns the result of the try that landed; an error that says "refused"
// is returned at once.
func TestApplyRetriesUnknownOutcomesUnchanged(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, hosted: true, leader: a}
	tries := 0
	h.propose = func(cmds []lockfsm.Command) ([]lockfsm.Result, error) {
		tries++
		if tries < 3 {
			return nil, dragonboat.ErrTimeout
		}
		return grantAll(cmds), nil
	}
	r := newTestRouter(t, h, nil)
	res, err := r.Apply(context.Background(), shard, acquire(7))
	if err != nil || res.Token != 7 {
		t.Fatalf("Apply = %+v, %v; want token 7", res, err)
	}
	h.mu.Lock()
	for i, b := range h.batches {
		if len(b) != 1 || !reflect.DeepEqual(b[0], acquire(7)) {
			t.Fatalf("try %d sent %+v, want the same command", i+1, b)
		}
	}
	h.mu.Unlock()
	if tries != 3 {
		t.Fatalf("%d tries, want 3", tries)
	}

	refused := errors.New("corrupt entry")
	h.propose = func([]lockfsm.Command) ([]lockfsm.Result, error) { tries++; return nil, refused }
	tries = 0
	if _, err := r.Apply(context.Background(), shard, acquire(8)); !errors.Is(err, refused) || tries != 1 {
		t.Fatalf("Apply = %v after %d tries, want the refusal after 1", err, tries)
	}
}

// When ctx ends while every try fails, the error says the shard is
// unavailable, and wraps both ctx's error and what the last try hit.
func TestApplyGivesUpWithTheLastError(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, hosted: true, leader: a}
	h.propose = func([]lockfsm.Command) ([]lockfsm.Result, error) { return nil, dragonboat.ErrShardNotReady }
	r := newTestRouter(t, h, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := r.Apply(ctx, shard, acquire(1))
	if !errors.Is(err, lockerr.Unavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Apply = %v, want Unavailable wrapping the deadline", err)
	}
	if want := dragonboat.ErrShardNotReady.Error(); !strings.Contains(err.Error(), want) {
		t.Fatalf("Apply = %v, want it to name the last error %q", err, want)
	}

	// dragonboat refuses a try with less than a tick left before it
	// proposes anything: that is retried, and the caller never sees the
	// raw error (issue 18: "shard 3: specified timeout value is too small"
	// reached a Lock caller).
	tries := 0
	h.propose = func(cmds []lockfsm.Command) ([]lockfsm.Result, error) {
		if tries++; tries == 1 {
			return nil, dragonboat.ErrTimeoutTooSmall
		}
		return grantAll(cmds), nil
	}
	if res, err := r.Apply(context.Background(), shard, acquire(2)); err != nil || res.Token != 2 {
		t.Fatalf("Apply after a too-small timeout = %+v, %v; want token 2 on the retry", res, err)
	}
	h.propose = func([]lockfsm.Command) ([]lockfsm.Result, error) { return nil, dragonboat.ErrTimeoutTooSmall }
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := r.Apply(ctx2, shard, acquire(3)); !errors.Is(err, lockerr.Unavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Apply with no time left = %v, want Unavailable wrapping the caller's deadline", err)
	}
}

// Close fails what is queued and in flight with Closed, later calls too,
// and leaves no goroutine behind (TestMain checks).
func TestCloseFailsQueuedCommands(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, hosted: true, leader: a, gate: make(chan struct{})}
	r := newTestRouter(t, h, nil)
	var states []*RequestState
	for i := range maxInflightLocal + 5 {
		rs, err := r.Propose(context.Background(), shard, acquire(uint64(i+1)))
		if err != nil {
			t.Fatal(err)
		}
		states = append(states, rs)
	}
	waitFor(t, func() bool { return h.waitingAtGate() > 0 })
	r.Close()
	for i, rs := range states {
		// Queued ones fail with Closed, those in flight with their
		// proposal's context, which Close ended.
		if o := <-rs.ResultC(); !errors.Is(o.Err, lockerr.Closed) && !errors.Is(o.Err, context.Canceled) {
			t.Fatalf("command %d: %+v, %v after Close, want Closed or canceled", i, o.Result, o.Err)
		}
	}
	if _, err := r.Propose(context.Background(), shard, acquire(99)); !errors.Is(err, lockerr.Closed) {
		t.Fatalf("Propose after Close = %v, want Closed", err)
	}
	if _, err := r.Apply(context.Background(), shard, acquire(99)); !errors.Is(err, lockerr.Closed) {
		t.Fatalf("Apply after Close = %v, want Closed", err)
	}
}

// A peer hosting no replica sends its batch to the shard's known leader
// first, moves on to the other hosts when it is unreachable, and learns
// the leader from the answer.
func TestForwardingFailsOverAndLearnsTheLeader(t *testing.T) {
	p := threePeers()
	p.Peers = append(p.Peers, layout.Peer{Name: "d"}) // d, this peer here, hosts nothing
	h := &fakeHost{p: p}
	peers := &fakePeers{}
	peers.f = func(addr string, body []byte) ([]byte, error) {
		if addr == "addr-b" {
			return nil, fmt.Errorf("dial: %w", transport.ErrUnavailable)
		}
		var req ProposeRequest
		if err := msgpack.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		if req.Level != 2 || req.Shard != shard {
			return nil, fmt.Errorf("request %+v lacks the level or shard", req)
		}
		cmds, err := lockfsm.DecodeCommands(req.Cmds)
		if err != nil {
			return nil, err
		}
		res, err := lockfsm.EncodeResults(grantAll(cmds))
		if err != nil {
			return nil, err
		}
		return msgpack.Marshal(ProposeResponse{Results: res, Leader: "c"})
	}
	r := New(Config{Name: "d", RTT: time.Millisecond, Peers: peers, ProposeMethod: 1}, h)
	defer r.Close()
	r.SetLeader(shard, "b")
	res, err := r.Apply(context.Background(), shard, acquire(5))
	if err != nil || res.Token != 5 {
		t.Fatalf("Apply = %+v, %v; want token 5", res, err)
	}
	calls := peers.called()
	if len(calls) < 2 || calls[0] != "addr-b" {
		t.Fatalf("calls %v, want the known leader b first, then another host", calls)
	}
	if got := r.Leader(shard); got != "c" {
		t.Fatalf("leader after the answer = %q, want c (from the answer)", got)
	}
	if got := r.LeaderGuess(shard); got != "c" {
		t.Fatalf("LeaderGuess = %q, want c", got)
	}
}

// A leader's own commands go through its own replica even when its view
// names another leader: hosts refuse them from the network, and the term
// they carry decides whether they apply. Other commands are forwarded.
func TestLeaderOnlyCommandsStayLocal(t *testing.T) {
	p := threePeers()
	b, _ := p.ReplicaID(shard, "b")
	h := &fakeHost{p: p, leader: b, hosted: true}
	peers := &fakePeers{f: func(string, []byte) ([]byte, error) { return nil, errors.New("forwarded") }}
	r := newTestRouter(t, h, peers)
	for _, cmd := range []lockfsm.Command{
		{Op: lockfsm.OpLeaderTerm, Term: 7},
		{Op: lockfsm.OpExpireSession, Session: 1, Term: 7},
	} {
		rs, err := r.Propose(context.Background(), shard, cmd)
		if err != nil {
			t.Fatal(err)
		}
		if o := <-rs.ResultC(); o.Err != nil {
			t.Fatalf("%v: %v, want it proposed on the local replica", cmd.Op, o.Err)
		}
	}
	if calls := peers.called(); len(calls) != 0 {
		t.Fatalf("leader-only commands were forwarded to %v", calls)
	}
	rs, err := r.Propose(context.Background(), shard, acquire(1))
	if err != nil {
		t.Fatal(err)
	}
	<-rs.ResultC()
	if calls := peers.called(); len(calls) == 0 || calls[0] != "addr-b" {
		t.Fatalf("an acquire was not forwarded to the leader b: calls %v", calls)
	}
}

// The leader hint is used only while the layout has that peer hosting the
// shard, and a hosting peer trusts its own replica's view first.
func TestLeaderGuess(t *testing.T) {
	p := threePeers()
	h := &fakeHost{p: p}
	r := newTestRouter(t, h, nil)
	r.SetLeader(shard, "gone")
	if got := r.LeaderGuess(shard); got != "" {
		t.Fatalf("LeaderGuess = %q for a peer the layout does not have, want none", got)
	}
	r.SetLeader(shard, "b")
	if got := r.LeaderGuess(shard); got != "b" {
		t.Fatalf("LeaderGuess = %q, want the hint b", got)
	}
	r.ForgetLeader(shard, "c") // not the recorded one: no change
	if got := r.Leader(shard); got != "b" {
		t.Fatalf("Leader = %q after forgetting another peer, want b", got)
	}
	h.hosted = true
	h.leader, _ = p.ReplicaID(shard, "c")
	if got := r.LeaderGuess(shard); got != "c" {
		t.Fatalf("LeaderGuess = %q, want the local replica's view c", got)
	}
}

// A peer without a replica refuses a forwarded batch with a code that
// sends the caller elsewhere; a host proposes it and names the leader.
func TestServePropose(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, leader: a}
	r := newTestRouter(t, h, nil)
	data, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{acquire(1), acquire(2)})
	if err != nil {
		t.Fatal(err)
	}
	req := ProposeRequest{Shard: shard, Cmds: data, Level: 2}
	if _, err := r.ServePropose(context.Background(), req); lockerr.Code(err) != lockerr.CodeNotHosted || !Retryable(err) {
		t.Fatalf("ServePropose without a replica = %v, want a retryable NotHosted", err)
	}
	h.hosted = true
	raw, err := r.ServePropose(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var resp ProposeResponse
	if err := msgpack.Unmarshal(raw, &resp); err != nil {
		t.Fatal(err)
	}
	results, err := lockfsm.DecodeResults(resp.Results)
	if err != nil || len(results) != 2 || results[0].Token != 1 || results[1].Token != 2 {
		t.Fatalf("results %+v, %v; want tokens 1 and 2", results, err)
	}
	if resp.Leader != "a" {
		t.Fatalf("answer names leader %q, want a", resp.Leader)
	}
	if _, err := r.ServePropose(context.Background(), ProposeRequest{Shard: shard, Cmds: []byte{0xff}}); err == nil {
		t.Fatal("ServePropose of garbage succeeded")
	}
	// The host decides what a caller may propose, before anything is
	// proposed: a refused command takes the whole proposal with it.
	proposed := len(h.batchSizes())
	refused, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{acquire(3), {Op: lockfsm.OpLeaderTerm, Term: 1 << 62}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ServePropose(context.Background(), ProposeRequest{Shard: shard, Cmds: refused, Level: 2}); err == nil || Retryable(err) {
		t.Fatalf("ServePropose of a command the host refuses = %v, want its refusal, not retryable", err)
	}
	if got := len(h.batchSizes()); got != proposed {
		t.Fatalf("a refused proposal was proposed: %d batches, want %d", got, proposed)
	}
}

func TestRetryable(t *testing.T) {
	for _, err := range []error{
		dragonboat.ErrShardClosed, fmt.Errorf("propose: %w", dragonboat.ErrShardClosed),
		dragonboat.ErrShardNotFound, dragonboat.ErrTimeout, lockerr.NotReady, dragonboat.ErrInvalidDeadline,
		dragonboat.ErrTimeoutTooSmall, fmt.Errorf("shard 4: %w", dragonboat.ErrTimeoutTooSmall),
		fmt.Errorf("%w: shard 2", lockerr.ReplicaHalted), transport.ErrUnavailable,
		lockerr.RPC(lockerr.CodeNotHosted, "moved"), lockerr.RPC(lockerr.CodeBusy, "busy"),
	} {
		if !Retryable(err) {
			t.Errorf("%v: not retryable", err)
		}
	}
	for _, err := range []error{
		lockerr.Closed, errors.New("corrupt entry"), lockerr.RPC(lockerr.CodeIncompatible, "old"),
		lockerr.RPC(lockerr.CodeRejected, "no"),
	} {
		if Retryable(err) {
			t.Errorf("%v: retryable", err)
		}
	}
}

func (h *fakeHost) waitingAtGate() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiting
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// groupOf is an all-or-nothing group of acquires from request id first.
func groupOf(first uint64, n int) []lockfsm.Command {
	cmds := make([]lockfsm.Command, n)
	for i := range cmds {
		cmds[i] = acquire(first + uint64(i))
		cmds[i].Group = uint16(n)
	}
	return cmds
}

// A group's commands share one entry, together and in order, even among
// single commands batched around them, and each gets its own result; a
// group that would push a batch past lockfsm.MaxBatch waits for the next.
func TestGroupsStayWholeInOneEntry(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, hosted: true, leader: a, gate: make(chan struct{})}
	// A long RTT, so the proposals held at the gate do not time out while
	// thousands of commands queue behind them (slow under -race).
	r := New(Config{Name: "a", RTT: 10 * time.Second, Peers: &fakePeers{f: func(string, []byte) ([]byte, error) { return nil, errors.New("no peers") }}, ProposeMethod: 1}, h)
	t.Cleanup(r.Close)
	ctx := context.Background()

	first := fillInflight(t, r, h)
	// Singles fill the next batch to MaxBatch-2, then a group of 3 that
	// does not fit, then more singles.
	var singles []*RequestState
	for i := range lockfsm.MaxBatch - 2 {
		rs, err := r.Propose(ctx, shard, acquire(uint64(10_000+i)))
		if err != nil {
			t.Fatal(err)
		}
		singles = append(singles, rs)
	}
	group, err := r.ProposeGroup(ctx, shard, groupOf(100, 3))
	if err != nil {
		t.Fatal(err)
	}
	// The queue holds MaxBatch commands and every in-flight slot is held
	// at the gate: the singles after the group may find the queue full
	// (when the batcher took fewer than 4 of the ones before), so they are
	// proposed while the gate opens. Proposing them before opening it
	// deadlocked until the held proposals timed out (seen under -race).
	trailing := make(chan *RequestState, 5)
	go func() {
		defer close(trailing)
		for i := range 5 {
			rs, err := r.Propose(ctx, shard, acquire(uint64(200+i)))
			if err != nil {
				t.Error(err)
				return
			}
			trailing <- rs
		}
	}()
	close(h.gate)
	for rs := range trailing {
		singles = append(singles, rs)
	}
	o := <-group.ResultC()
	if o.Err != nil || len(o.Results) != 3 || o.Results[0].Token != 100 || o.Results[2].Token != 102 || o.Result.Token != o.Results[0].Token {
		t.Fatalf("group outcome %+v", o)
	}
	for _, rs := range append(first, singles...) {
		if o := <-rs.ResultC(); o.Err != nil || o.Result.Token != rs.cmds[0].Req {
			t.Fatalf("single outcome %+v for request %d", o, rs.cmds[0].Req)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	found := 0
	for _, b := range h.batches {
		if len(b) > lockfsm.MaxBatch {
			t.Fatalf("a batch of %d commands", len(b))
		}
		for i, c := range b {
			if c.Req == 100 {
				found++
				if i+2 >= len(b) || b[i+1].Req != 101 || b[i+2].Req != 102 {
					t.Fatalf("the group was split or reordered in its entry: %+v", b[i:])
				}
			}
		}
	}
	if found != 1 {
		t.Fatalf("the group's first command is in %d entries", found)
	}
	if _, err := r.ProposeGroup(ctx, shard, groupOf(1, lockfsm.MaxGroup+1)); err == nil {
		t.Fatal("a group larger than MaxGroup was proposed")
	}
}

// A forwarded proposal is re-batched command by command, but its groups
// stay whole (lockfsm.Units), and the results come back in its order.
func TestServeProposeKeepsGroupsWhole(t *testing.T) {
	p := threePeers()
	a, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, hosted: true, leader: a}
	r := newTestRouter(t, h, nil)
	cmds := append(append([]lockfsm.Command{acquire(1)}, groupOf(2, 3)...), acquire(5))
	data, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, cmds)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := r.ServePropose(context.Background(), ProposeRequest{Shard: shard, Cmds: data, Level: 2})
	if err != nil {
		t.Fatal(err)
	}
	var resp ProposeResponse
	if err := msgpack.Unmarshal(raw, &resp); err != nil {
		t.Fatal(err)
	}
	results, err := lockfsm.DecodeResults(resp.Results)
	if err != nil || len(results) != 5 {
		t.Fatalf("results %+v, %v", results, err)
	}
	for i, res := range results {
		if res.Token != uint64(i+1) {
			t.Fatalf("result %d has token %d: out of order", i, res.Token)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, b := range h.batches {
		for i, c := range b {
			if c.Req == 2 && (i+2 >= len(b) || b[i+1].Req != 3 || b[i+2].Req != 4) {
				t.Fatalf("the forwarded group was split: %+v", b)
			}
		}
	}
}

// fillInflight fills every in-flight slot of r's local batcher with one
// acquire each (request ids 1 and on), held at h's gate, and returns them.
func fillInflight(t *testing.T, r *Router, h *fakeHost) []*RequestState {
	t.Helper()
	var first []*RequestState
	for i := range maxInflightLocal {
		rs, err := r.Propose(context.Background(), shard, acquire(uint64(i+1)))
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, rs)
		waitFor(t, func() bool { return h.waitingAtGate() == i+1 })
	}
	return first
}

// BenchmarkLeaderGuess is the leader lookup every proposal makes on a
// peer that hosts the shard, in a layout of 16 lock shards.
func BenchmarkLeaderGuess(b *testing.B) {
	p := layout.New(1, 16, 3, layout.KeySchemeHashTag, []layout.Peer{{Name: "a"}, {Name: "b"}, {Name: "c"}})
	c, _ := p.ReplicaID(shard+15, "c")
	r := New(Config{Name: "a", RTT: time.Millisecond}, &fakeHost{p: p, hosted: true, leader: c})
	defer r.Close()
	for b.Loop() {
		if r.LeaderGuess(shard+15) != "c" {
			b.Fatal("wrong leader")
		}
	}
}

// From the level that caps sessions on apply (level.CapsSessions), every
// OpenSession of an entry this peer writes is marked Capped, its own and
// those forwarded to it, so none escapes the caps; below it, none is,
// since a replica of an older release would halt on the mark.
func TestOpenSessionsCappedAtTheLevel(t *testing.T) {
	for _, capped := range []bool{false, true} {
		p := threePeers()
		if capped {
			p.Level = uint32(level.Family)
		}
		a, _ := p.ReplicaID(shard, "a")
		h := &fakeHost{p: p, hosted: true, leader: a}
		r := New(Config{Name: "a", RTT: time.Millisecond, ProposeMethod: 1}, h)
		open := lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}
		if _, err := r.Apply(context.Background(), shard, open); err != nil {
			t.Fatal(err)
		}
		forwarded, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{acquire(1), {Op: lockfsm.OpOpenSession, Owner: "b", TTLMillis: 1000}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.ServePropose(context.Background(), ProposeRequest{Shard: shard, Cmds: forwarded, Level: 3}); err != nil {
			t.Fatal(err)
		}
		r.Close()
		opens := 0
		for _, b := range h.batches {
			for _, c := range b {
				if c.Op == lockfsm.OpOpenSession {
					opens++
				}
				if c.Capped != (capped && c.Op == lockfsm.OpOpenSession) {
					t.Errorf("CapSessions %v: %v command written with Capped %v", capped, c.Op, c.Capped)
				}
			}
		}
		if opens != 2 {
			t.Fatalf("%d OpenSessions written, want 2", opens)
		}
	}
}
