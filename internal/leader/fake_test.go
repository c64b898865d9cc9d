package leader

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lni/dragonboat/v4/raftio"
	"go.uber.org/goleak"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lease"
	"github.com/lockmesh/lockmesh/lockfsm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The tests run the leader side against a fake peer: a scripted replica
// of each shard (its leader, term and sessions), proposals recorded and
// answered by a func, RPCs recorded and answered by a func, and a clock
// that moves only when a test moves it.

const (
	ttl             = 10 * time.Second
	electionTimeout = 100 * time.Millisecond
	grace           = 2 * electionTimeout
	shard           = layout.FirstLockShard
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// threePeers is a layout of a, b and c, each hosting every shard; the
// tests run on a.
func threePeers() *layout.Placement {
	return layout.New(1, 2, 3, layout.KeySchemeHashTag, []layout.Peer{{Name: "a"}, {Name: "b"}, {Name: "c"}})
}

// proposal is one command the leader side proposed.
type proposal struct {
	shard uint64
	cmd   lockfsm.Command
}

// notice is one grant notice the leader side sent.
type notice struct {
	addr   string
	method uint8
	body   []byte
}

type fakeHost struct {
	mu     sync.Mutex
	p      *layout.Placement
	hosted bool
	self   uint64 // this peer's replica of every shard
	// leader and term are what LeaderID reports (ok when leader != 0);
	// termAfterRead, when set, replaces term once ReadSessions ran.
	leader, term  uint64
	termAfterRead uint64
	states        map[uint64]lease.State // what the replica of each shard reads
	readErr       error
	proposals     []proposal
	// apply answers proposals; nil answers OK.
	apply func(ctx context.Context, p proposal) (lockfsm.Result, error)
	// call answers notices; nil answers nothing.
	call    func(ctx context.Context, n notice) error
	notices []notice
}

func (h *fakeHost) Placement() *layout.Placement {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.p
}
func (h *fakeHost) Hosts(uint64) bool { return h.hosted }
func (h *fakeHost) LocalReplica(uint64) (uint64, bool) {
	return h.self, h.hosted
}
func (h *fakeHost) LeaderID(uint64) (uint64, uint64, bool, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.leader, h.term, h.leader != 0, nil
}
func (h *fakeHost) ReadSessions(_ context.Context, shard uint64) (lease.State, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.termAfterRead != 0 {
		h.term = h.termAfterRead
	}
	return h.states[shard], h.readErr
}
func (h *fakeHost) StaleSessions(shard uint64) (lease.State, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.states[shard]
	if !ok {
		return lease.State{}, errors.New("no replica")
	}
	return st, nil
}
func (h *fakeHost) setState(shard uint64, st lease.State) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.states == nil {
		h.states = map[uint64]lease.State{}
	}
	h.states[shard] = st
}
func (h *fakeHost) Apply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	p := proposal{shard, cmd}
	h.mu.Lock()
	h.proposals = append(h.proposals, p)
	f := h.apply
	h.mu.Unlock()
	if f == nil {
		return lockfsm.Result{Status: lockfsm.StatusOK}, nil
	}
	return f(ctx, p)
}
func (h *fakeHost) proposed() []proposal {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]proposal(nil), h.proposals...)
}
func (h *fakeHost) ProposalTimeout() time.Duration { return time.Second }

// Addr knows every peer but x.
func (h *fakeHost) Addr(name string) (string, bool) {
	if name == "x" {
		return "", false
	}
	return "addr-" + name, true
}
func (h *fakeHost) Call(ctx context.Context, addr string, method uint8, body []byte) ([]byte, error) {
	n := notice{addr, method, body}
	h.mu.Lock()
	h.notices = append(h.notices, n)
	f := h.call
	h.mu.Unlock()
	if f == nil {
		return nil, nil
	}
	return nil, f(ctx, n)
}
func (h *fakeHost) sent() []notice {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]notice(nil), h.notices...)
}

// fakeClock is the lease clock; tests move it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}
func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// fixture is the leader side of peer a, whose replica of every shard is
// replica self.
type fixture struct {
	s       *Sessions
	h       *fakeHost
	clock   *fakeClock
	waiters *client.Waiters
	self    uint64
}

const notifyMethod = 4

func newFixture(t *testing.T) *fixture {
	t.Helper()
	p := threePeers()
	self, _ := p.ReplicaID(shard, "a")
	h := &fakeHost{p: p, hosted: true, self: self}
	clock := &fakeClock{now: t0}
	w := client.NewWaiters()
	s := New(Config{
		Name: "a", SessionTTL: ttl, RTT: time.Millisecond, ElectionTimeout: electionTimeout,
		Now: clock.Now, Waiters: w, NotifyMethod: notifyMethod,
	}, h)
	return &fixture{s: s, h: h, clock: clock, waiters: w, self: self}
}

// elect reports, as dragonboat would, that this peer's replica leads
// shard in term; the fake replica then says so too.
func (f *fixture) elect(shard, term uint64) {
	f.h.mu.Lock()
	f.h.leader, f.h.term = f.self, term
	f.h.mu.Unlock()
	f.s.LeaderUpdated(raftio.LeaderInfo{ShardID: shard, ReplicaID: f.self, LeaderID: f.self, Term: term})
}

func raftioInfo(shard, replica, leader, term uint64) raftio.LeaderInfo {
	return raftio.LeaderInfo{ShardID: shard, ReplicaID: replica, LeaderID: leader, Term: term}
}

// sessions lists sessions ids, each with the test TTL.
func sessions(ids ...uint64) []lockfsm.SessionInfo {
	var out []lockfsm.SessionInfo
	for _, id := range ids {
		out = append(out, lockfsm.SessionInfo{ID: id, Owner: "b", TTLMillis: uint64(ttl / time.Millisecond)})
	}
	return out
}

// waitFor waits for cond, bounded for a loaded machine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
