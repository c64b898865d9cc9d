package mesh

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/lockmesh/lockmesh/internal/level"
)

// recorder collects OnEvent calls.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) add(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) find(kind EventKind, name string) (Event, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.Kind == kind && e.Member.Name == name {
			return e, true
		}
	}
	return Event{}, false
}

func testMeta(name string) Meta {
	return Meta{NodeHostID: "nh-" + name, RaftAddr: "raft-" + name + ":1", RPCAddr: "rpc-" + name + ":2", MaxLevel: 1}
}

// startMesh creates a loopback peer that Close()s at test end.
func startMesh(t *testing.T, name string, key []byte, rec *recorder) *Mesh {
	t.Helper()
	return startMeshWith(t, Config{Name: name, BindAddr: "127.0.0.1:0", SecretKey: key, Meta: testMeta(name), Local: true}, rec)
}

// startMeshWith creates the peer cfg describes, reporting its events to
// rec if set, that Close()s at test end. MESH_DEBUG with -v logs it.
func startMeshWith(t *testing.T, cfg Config, rec *recorder) *Mesh {
	t.Helper()
	if testing.Verbose() && os.Getenv("MESH_DEBUG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("peer", cfg.Name)
	}
	if rec != nil {
		cfg.OnEvent = rec.add
	}
	m, err := Create(cfg)
	if err != nil {
		t.Fatalf("Create(%s): %v", cfg.Name, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// waitFor polls cond until it holds or d passes. The bounds are generous: they
// catch a mesh that never converges, not a slow one (the race detector on
// a loaded 2-core machine slows memberlist several times over).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func names(ms []Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

func joinCtx(t *testing.T, m *Mesh, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := m.Join(ctx, []string{addr}); err != nil || n != 1 {
		t.Fatalf("%s: Join(%s) = %d, %v", m.LocalName(), addr, n, err)
	}
}

// joinRefused runs m.Join to addr until m.JoinError says want, then
// cancels it and returns what Join returned. The 30s bounds fail a refusal
// that is never explained or a Join that ignores its context, not a slow
// machine: refusals are known within milliseconds.
func joinRefused(t *testing.T, m *Mesh, addr, want string) (int, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := m.Join(ctx, []string{addr})
		done <- result{n, err}
	}()
	waitFor(t, 30*time.Second, fmt.Sprintf("%s: JoinError never said %q", m.LocalName(), want), func() bool {
		select {
		case r := <-done:
			t.Fatalf("%s: Join returned %d, %v before JoinError said %q", m.LocalName(), r.n, r.err, want)
		default:
		}
		je := m.JoinError()
		return je != nil && strings.Contains(je.Error(), want)
	})
	cancel()
	select {
	case r := <-done:
		return r.n, r.err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: Join did not return 30s after its context was cancelled", m.LocalName())
		return 0, nil
	}
}

func TestMeshMembership(t *testing.T) {
	for _, size := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d peers", size), func(t *testing.T) {
			t.Parallel()
			testMembership(t, size)
		})
	}
}

func testMembership(t *testing.T, size int) {
	meshes := make([]*Mesh, size)
	recs := make([]*recorder, size)
	var want []string
	for i := range meshes {
		recs[i] = &recorder{}
		meshes[i] = startMesh(t, fmt.Sprintf("m%d", i), nil, recs[i])
		want = append(want, meshes[i].LocalName())
	}
	// Everyone joins through the first peer only.
	for _, m := range meshes[1:] {
		joinCtx(t, m, meshes[0].Addr())
	}
	for _, m := range meshes {
		waitFor(t, 20*time.Second, m.LocalName()+" sees every peer", func() bool {
			return slices.Equal(names(m.Members()), want)
		})
		for _, mem := range m.Members() {
			if mem.Meta != testMeta(mem.Name) || mem.State != StateAlive {
				t.Fatalf("%s sees %+v, want meta %+v alive", m.LocalName(), mem, testMeta(mem.Name))
			}
		}
	}
	// Events reach the recorder after the member view changes: wait.
	for i, rec := range recs {
		for _, name := range want {
			waitFor(t, 10*time.Second, fmt.Sprintf("m%d gets a join event for %s", i, name), func() bool {
				_, ok := rec.find(EventJoin, name)
				return ok
			})
		}
	}

	// The registry of m0 resolves m1's NodeHostID to m1's raft address.
	reg, err := meshes[0].NodeRegistryFactory().Create("nh-m0", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg.Add(7, 2, "nh-m1")
	mustResolve(t, reg, 7, 2, "raft-m1:1")

	// Metadata updates reach everyone, and m0 hears an update event.
	changed := testMeta("m1")
	changed.Cluster = 42
	changed.RaftAddr = "raft-m1-moved:1"
	if err := meshes[1].SetMeta(changed); err != nil {
		t.Fatalf("SetMeta: %v", err)
	}
	if got := meshes[1].LocalMeta(); got != changed {
		t.Fatalf("LocalMeta = %+v, want %+v", got, changed)
	}
	for _, m := range meshes {
		waitFor(t, 20*time.Second, m.LocalName()+" sees m1's new meta", func() bool {
			mem, ok := m.Member("m1")
			return ok && mem.Meta == changed
		})
	}
	waitFor(t, 10*time.Second, "m0 gets an update event for m1", func() bool {
		e, ok := recs[0].find(EventUpdate, "m1")
		return ok && e.Member.Meta == changed
	})
	mustResolve(t, reg, 7, 2, "raft-m1-moved:1")

	// A peer that vanishes without Leave is eventually dead.
	last := meshes[size-1]
	if err := last.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	reg.Add(7, 3, "nh-"+last.LocalName())
	waitFor(t, 30*time.Second, "m0 sees "+last.LocalName()+" dead", func() bool {
		e, ok := recs[0].find(EventLeave, last.LocalName())
		return ok && e.Member.State == StateDead
	})
	if _, ok := meshes[0].Member(last.LocalName()); ok {
		t.Fatalf("dead %s still listed", last.LocalName())
	}
	mustNotResolve(t, reg, 7, 3)

	// A peer that leaves is seen as left.
	leaver := meshes[1]
	if err := leaver.Leave(2 * time.Second); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if err := leaver.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitFor(t, 20*time.Second, "m0 sees m1 left", func() bool {
		e, ok := recs[0].find(EventLeave, "m1")
		return ok && e.Member.State == StateLeft
	})
	mustNotResolve(t, reg, 7, 2)
	wantLeft := slices.DeleteFunc(slices.Clone(want), func(n string) bool { return n == "m1" || n == last.LocalName() })
	if got := names(meshes[0].Members()); !slices.Equal(got, wantLeft) {
		t.Fatalf("m0 members after leave and death = %v, want %v", got, wantLeft)
	}
}

func TestGossipEncryption(t *testing.T) {
	t.Parallel()
	key := []byte("0123456789abcdef0123456789abcdef")
	other := []byte("fedcba9876543210")
	a := startMesh(t, "a", key, nil)
	b := startMesh(t, "b", key, nil)
	joinCtx(t, b, a.Addr())
	waitFor(t, 20*time.Second, "a and b see each other", func() bool {
		return len(a.Members()) == 2 && len(b.Members()) == 2
	})

	plain := startMesh(t, "plain", nil, nil)
	wrong := startMesh(t, "wrong", other, nil)
	for _, m := range []*Mesh{plain, wrong} {
		// Said plainly, on one line, and known before ctx ends: Join
		// runs until JoinError says it, then its context is cancelled.
		want := "gossip key mismatch with " + a.Addr()
		n, err := joinRefused(t, m, a.Addr(), want)
		if err == nil || n != 0 {
			t.Fatalf("%s joined an encrypted mesh: n=%d err=%v", m.LocalName(), n, err)
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Join error %v does not wrap the context error", m.LocalName(), err)
		}
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s: Join error %q; want one line saying %q", m.LocalName(), err, want)
		}
		if je := m.JoinError(); je == nil || !strings.Contains(je.Error(), want) {
			t.Fatalf("%s: JoinError() = %v; want it to say %q", m.LocalName(), je, want)
		}
	}
	// Give stray packets time to land, then check nobody got in.
	time.Sleep(500 * time.Millisecond)
	for _, m := range []*Mesh{a, b} {
		if got := names(m.Members()); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("%s members = %v, want [a b]", m.LocalName(), got)
		}
	}
	for _, m := range []*Mesh{plain, wrong} {
		if got := names(m.Members()); !slices.Equal(got, []string{m.LocalName()}) {
			t.Fatalf("%s members = %v, want only itself", m.LocalName(), got)
		}
	}
}

// A peer whose metadata cannot be decoded stays a gossip member but is
// invisible to Members, events and the registry.
func TestUndecodableMetaIgnored(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	m := startMesh(t, "m", nil, rec)

	mc := memberlist.DefaultLocalConfig()
	mc.Name = "alien"
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	mc.Delegate = fixedMeta([]byte{0x7f, 0x01})
	mc.Logger = slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)
	alien, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { alien.Shutdown() })
	if _, err := alien.Join([]string{m.Addr()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "memberlist sees the alien", func() bool { return m.list.NumMembers() == 2 })
	if got := names(m.Members()); !slices.Equal(got, []string{"m"}) {
		t.Fatalf("Members = %v, want [m]", got)
	}
	if _, ok := m.Member("alien"); ok {
		t.Fatal("Member(alien) found")
	}
	if _, ok := rec.find(EventJoin, "alien"); ok {
		t.Fatal("join event for the alien")
	}
}

type fixedMeta []byte

func (f fixedMeta) NodeMeta(int) []byte                  { return f }
func (fixedMeta) NotifyMsg([]byte)                       {}
func (fixedMeta) GetBroadcasts(int, int) [][]byte        { return nil }
func (fixedMeta) LocalState(bool) []byte                 { return nil }
func (fixedMeta) MergeRemoteState(buf []byte, join bool) {}

func TestMeshLifecycle(t *testing.T) {
	t.Parallel()
	m := startMesh(t, "solo", nil, nil)
	if got := names(m.Members()); !slices.Equal(got, []string{"solo"}) {
		t.Fatalf("Members = %v, want [solo]", got)
	}
	if n, err := m.Join(context.Background(), nil); n != 0 || err != nil {
		t.Fatalf("Join(nil) = %d, %v; want 0, nil", n, err)
	}
	// Nothing listens on port 1: Join retries until ctx ends, and then
	// returns (BenchmarkJoinOverrun measures how soon).
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	joined := make(chan error, 1)
	go func() {
		_, err := m.Join(ctx, []string{"127.0.0.1:1"})
		joined <- err
	}()
	select {
	case err := <-joined:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Join to a closed port: %v, want DeadlineExceeded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Join to a closed port did not return 30s after its 400ms context ended")
	}
	cancel()
	// The registry works before any other member exists.
	reg, err := m.NodeRegistryFactory().Create("nh-solo", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg.Add(1, 1, "nh-nobody")
	mustNotResolve(t, reg, 1, 1)
	reg.Add(1, 2, "nh-solo")
	mustResolve(t, reg, 1, 2, "raft-solo:1")

	if err := m.SetMeta(Meta{RPCAddr: string(make([]byte, 300))}); !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("SetMeta too large: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := m.Join(context.Background(), []string{"127.0.0.1:1"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Join after Close: %v", err)
	}
	if err := m.SetMeta(Meta{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("SetMeta after Close: %v", err)
	}
	if err := m.Leave(time.Second); !errors.Is(err, ErrClosed) {
		t.Fatalf("Leave after Close: %v", err)
	}
}

// Closing while a Join is in flight waits for it rather than leaking it.
func TestCloseDuringJoin(t *testing.T) {
	t.Parallel()
	m := startMesh(t, "joiner", nil, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := m.Join(ctx, []string{"127.0.0.1:1"})
		done <- err
	}()
	waitFor(t, 30*time.Second, "Join never tried the closed port", func() bool { return m.JoinError() != nil })
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Join succeeded against a closed port")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Join did not return 30s after Close and cancel")
	}
}

// spyTransport counts what memberlist sends through a transport and
// whether it was shut down; failAdvertise makes Create fail.
type spyTransport struct {
	memberlist.NodeAwareTransport
	mu            sync.Mutex
	writes        int
	shutdowns     int
	failAdvertise bool
}

func (s *spyTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if s.failAdvertise {
		return nil, 0, errors.New("spy: no address")
	}
	return s.NodeAwareTransport.FinalAdvertiseAddr(ip, port)
}

func (s *spyTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	s.mu.Lock()
	s.writes++
	s.mu.Unlock()
	return s.NodeAwareTransport.WriteToAddress(b, a)
}

func (s *spyTransport) Shutdown() error {
	s.mu.Lock()
	s.shutdowns++
	s.mu.Unlock()
	return s.NodeAwareTransport.Shutdown()
}

func (s *spyTransport) counts() (writes, shutdowns int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes, s.shutdowns
}

func newSpyTransport(t *testing.T) *spyTransport {
	t.Helper()
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"},
		Logger:    log.New(io.Discard, "", 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	return &spyTransport{NodeAwareTransport: nt}
}

// Config.Transport carries all gossip, and the Mesh owns it.
func TestCustomTransport(t *testing.T) {
	spy := newSpyTransport(t)
	port := spy.NodeAwareTransport.(*memberlist.NetTransport).GetAutoBindPort()
	m, err := Create(Config{Name: "custom", BindAddr: "127.0.0.1:0", Meta: testMeta("custom"), Local: true, Transport: spy})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if want := net.JoinHostPort("127.0.0.1", strconv.Itoa(port)); m.Addr() != want {
		t.Fatalf("Addr() = %s, want the transport's %s", m.Addr(), want)
	}
	other := startMesh(t, "plain", nil, nil)
	joinCtx(t, other, m.Addr())
	want := []string{"custom", "plain"}
	waitFor(t, 20*time.Second, "both peers see each other", func() bool {
		return slices.Equal(names(m.Members()), want) && slices.Equal(names(other.Members()), want)
	})
	waitFor(t, 20*time.Second, "a probe or gossip packet written through Config.Transport", func() bool {
		w, _ := spy.counts()
		return w > 0
	})
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, s := spy.counts(); s == 0 {
		t.Fatal("Close did not shut the transport down")
	}

	bad := newSpyTransport(t)
	bad.failAdvertise = true
	if _, err := Create(Config{Name: "bad", BindAddr: "127.0.0.1:0", Transport: bad}); err == nil {
		t.Fatal("Create succeeded with a transport that has no address")
	}
	if _, s := bad.counts(); s == 0 {
		t.Fatal("a failed Create left its transport running")
	}
}

// startMeshVersions starts a loopback peer that speaks protocol versions
// lo to hi.
func startMeshVersions(t *testing.T, name string, lo, hi level.Level) *Mesh {
	t.Helper()
	meta := testMeta(name)
	meta.MinLevel, meta.MaxLevel = lo, hi
	m, err := Create(Config{Name: name, BindAddr: "127.0.0.1:0", Meta: meta, Local: true})
	if err != nil {
		t.Fatalf("Create(%s): %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// A peer is admitted only if it speaks a protocol version in common with
// this one, and once the cluster's level is known, only if it speaks that
// level; the refused peer's Join says why.
func TestIncompatibleVersionsRefused(t *testing.T) {
	t.Parallel()
	a := startMeshVersions(t, "a", 1, 2)
	older := startMeshVersions(t, "older", 1, 1)
	joinCtx(t, older, a.Addr())
	waitFor(t, 20*time.Second, "a admits a peer that speaks version 1", func() bool { return len(a.Members()) == 2 })

	refused := func(m *Mesh, want string) {
		t.Helper()
		n, err := joinRefused(t, m, a.Addr(), want)
		if err == nil || n != 0 {
			t.Fatalf("%s joined: n=%d err=%v", m.LocalName(), n, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: Join error %q does not say %q", m.LocalName(), err, want)
		}
	}
	newer := startMeshVersions(t, "newer", 3, 4)
	refused(newer, "this peer 3 to 4: none in common")

	// A member admitted before the level was known leaves the view once
	// the level is set and it does not speak it; so do later ones.
	a.SetLevel(2)
	if got := names(a.Members()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("a's members after SetLevel(2) = %v, want [a]: older speaks only 1", got)
	}
	// A peer that does not know the level yet (or predates levels) may
	// believe it joined: memberlist hands it a's state before a refuses
	// it. a still never admits it, so none of a's traffic goes to it.
	stale := startMeshVersions(t, "stale", 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, _ = stale.Join(ctx, []string{a.Addr()})
	cancel()

	// Nobody refused got into a's view, by join or by gossip.
	time.Sleep(500 * time.Millisecond)
	if got := names(a.Members()); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("a's members = %v, want [a]", got)
	}
}
