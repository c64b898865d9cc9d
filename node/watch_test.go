package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/peer"
)

// next returns the watch's next response that is not a bookmark.
func next(t *testing.T, ch <-chan WatchResponse) WatchResponse {
	t.Helper()
	timeout := time.After(30 * time.Second) // fails a watch that stopped, not a slow one
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatal("the watch channel closed")
			}
			if r.Err != nil {
				t.Fatalf("the watch ended: %v", r.Err)
			}
			if !r.Bookmark {
				return r
			}
		case <-timeout:
			t.Fatal("no watch response within 30s")
		}
	}
}

func describeEvents(es []WatchEvent) string {
	var b strings.Builder
	for _, e := range es {
		fmt.Fprintf(&b, "%v %s t%d %q; ", e.Kind, e.Key, e.Holder.Token, e.Holder.Value)
	}
	return b.String()
}

// A watch starts from a snapshot, then delivers every entry that touched
// the key, in index order, all of one entry's events together: a release
// and the grant it hands the key on to arrive as one response.
func TestWatchDeliversEveryEntryInOrder(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s1, s2 := newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	l1, err := s1.Lock(ctx, "w", WithValue([]byte("a")))
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	ch, err := n.Watch(wctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	first := next(t, ch)
	if !first.Snapshot || first.Resync || len(first.Keys) != 1 || first.Keys[0].Holders[0].Token != l1.Token() || string(first.Keys[0].Holders[0].Value) != "a" {
		t.Fatalf("first response %+v, want a snapshot of w held by token %d with value a", first, l1.Token())
	}
	last := first.Index
	expect := func(want string) WatchResponse {
		t.Helper()
		r := next(t, ch)
		if r.Snapshot || r.Index <= last {
			t.Fatalf("response %+v after index %d, want events of a later entry", r, last)
		}
		last = r.Index
		if got := describeEvents(r.Events); got != want {
			t.Fatalf("events at %d:\n got %s\nwant %s", r.Index, got, want)
		}
		return r
	}
	got := make(chan *Lock, 1)
	go func() {
		l, _ := s2.Lock(ctx, "w", WithValue([]byte("b")))
		got <- l
	}()
	expect(`queued w t0 "b"; `)
	if err := l1.SetValue(ctx, []byte("a2")); err != nil {
		t.Fatal(err)
	}
	expect(fmt.Sprintf(`value w t%d "a2"; `, l1.Token()))
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	expect(fmt.Sprintf(`released w t%d ""; granted w t%d "b"; `, l1.Token(), l2.Token()))
	// Another key's entries are not this watch's.
	other, err := s1.Lock(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	other.Release()
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	expect(fmt.Sprintf(`released w t%d ""; `, l2.Token()))

	// A watch resumed after an index delivers what followed it, without
	// a snapshot.
	l3, err := s1.Lock(ctx, "w")
	if err != nil {
		t.Fatal(err)
	}
	resumed, err := n.Watch(wctx, "w", WithStartIndex(first.Index))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for len(kinds) < 5 {
		r := next(t, resumed)
		if r.Snapshot {
			t.Fatalf("a resumed watch began with a snapshot: %+v", r)
		}
		for _, e := range r.Events {
			kinds = append(kinds, e.Kind.String())
		}
	}
	if got := strings.Join(kinds, " "); got != "queued value released granted released" {
		t.Fatalf("the resumed watch saw %s", got)
	}
	if r := next(t, resumed); len(r.Events) != 1 || r.Events[0].Kind != Granted || r.Events[0].Holder.Token != l3.Token() {
		t.Fatalf("the resumed watch's next response %+v, want the grant of token %d", r, l3.Token())
	}
}

// A prefix watch within one hash tag sees each of its keys; a prefix
// without a whole hash tag is refused, as are bad keys.
func TestWatchPrefix(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	for _, tc := range []struct {
		key  string
		opts []WatchOption
		want error
	}{
		{"orders/", []WatchOption{WithPrefix()}, ErrInvalidArgument},
		{"{orders", []WatchOption{WithPrefix()}, ErrInvalidArgument},
		{"", nil, ErrInvalidKey},
		{strings.Repeat("k", MaxKeyLen+1), nil, ErrInvalidKey},
		{"k", []WatchOption{WithWatchBuffer(-1)}, ErrInvalidArgument},
	} {
		if _, err := n.Watch(ctx, tc.key, tc.opts...); !errors.Is(err, tc.want) {
			t.Errorf("Watch(%.20q): %v, want %v", tc.key, err, tc.want)
		}
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	ch, err := n.Watch(wctx, "{o-1}/", WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if r := next(t, ch); !r.Snapshot || len(r.Keys) != 0 {
		t.Fatalf("first response %+v, want an empty snapshot", r)
	}
	for _, key := range []string{"{o-1}/items", "{o-2}/items", "{o-1}/payment"} {
		l, err := n.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	for len(seen) < 4 {
		for _, e := range next(t, ch).Events {
			seen = append(seen, e.Kind.String()+" "+e.Key)
		}
	}
	if got := strings.Join(seen, ", "); got != "granted {o-1}/items, released {o-1}/items, granted {o-1}/payment, released {o-1}/payment" {
		t.Fatalf("the prefix watch saw %s", got)
	}
}

// A watch whose replicas no longer hold the entries after its index says
// so with a Resync carrying the state, never a silent gap; with
// WithNoResync it ends with ErrSlowWatcher. A consumer that stops reading
// holds up only its buffer: it falls behind and is resynced.
func TestWatchResyncsWhenTheEntriesAreGone(t *testing.T) {
	peers := startCluster(t, clusterOpts{peers: 1, rf: 1, shards: 1, ttl: 5 * time.Second, hook: func(h *peer.Hooks) { h.JournalEvents = 32 }})
	n, ctx := peers[0].node, ctxT(t, time.Minute)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	ch, err := n.Watch(wctx, "r", WithWatchBuffer(0))
	if err != nil {
		t.Fatal(err)
	}
	start := next(t, ch)
	churn := func() {
		for range 40 { // 80 events, beyond the journals' 32
			l, err := n.Lock(ctx, "r")
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	churn() // nobody reads the watch meanwhile
	held, err := n.Lock(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	// What the watch held up is at most one answer (a host's batches),
	// then it resyncs to the state with the lock held.
	for {
		r := next(t, ch)
		if r.Index <= start.Index {
			t.Fatalf("index %d after %d", r.Index, start.Index)
		}
		if r.Resync {
			if !r.Snapshot || len(r.Keys) != 1 || r.Keys[0].Holders[0].Token != held.Token() {
				t.Fatalf("the resync %+v, want the state with token %d holding r", r, held.Token())
			}
			break
		}
	}
	slow, err := n.Watch(wctx, "r", WithStartIndex(start.Index), WithNoResync())
	if err != nil {
		t.Fatal(err)
	}
	r, ok := <-slow
	if !ok || !errors.Is(r.Err, ErrSlowWatcher) {
		t.Fatalf("a watch resumed after entries no longer held, without resyncs: %+v, want ErrSlowWatcher", r)
	}
	if _, ok := <-slow; ok {
		t.Fatal("the watch went on after its error")
	}
}

// Observe reports the leader as a read found it, then every change: a
// new leader (a resignation to the next candidate is one change), a
// proclamation, a vacancy.
func TestObserveReportsEveryLeaderChange(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s1, s2 := newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	const name = "election/observed"
	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs, err := s2.Election(name).Observe(octx)
	if err != nil {
		t.Fatal(err)
	}
	expect := func(want string) {
		t.Helper()
		select {
		case ev := <-obs:
			got := "vacant"
			if ev.Err != nil {
				t.Fatalf("observe ended: %v", ev.Err)
			}
			if ev.Leader != nil {
				got = fmt.Sprintf("%s t%d", ev.Leader.Value, ev.Leader.Term)
			}
			if got != want {
				t.Fatalf("observed %s, want %s", got, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("nothing observed within 30s; want %s", want)
		}
	}
	expect("vacant")
	ld1, err := s1.Election(name).Campaign(ctx, []byte("one"))
	if err != nil {
		t.Fatal(err)
	}
	expect(fmt.Sprintf("one t%d", ld1.Term()))
	second := campaignAsync(ctx, s2.Election(name), "two")
	waitQueued(t, n, name, 1)
	if err := ld1.Proclaim(ctx, []byte("one'")); err != nil {
		t.Fatal(err)
	}
	expect(fmt.Sprintf("one' t%d", ld1.Term()))
	if err := ld1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-second
	if r.err != nil {
		t.Fatal(r.err)
	}
	expect(fmt.Sprintf("two t%d", r.ld.Term()))
	if err := r.ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	expect("vacant")
}

// A peer with no replica of the key's shard watches it through a host
// (MethodWatch), and goes on through another host when its host leaves.
func TestWatchThroughAnotherPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three peers")
	}
	peers := startCluster(t, clusterOpts{peers: 3, rf: 1, shards: 1, ttl: 2 * time.Second})
	ctx := ctxT(t, 90*time.Second)
	var watcher, host *Node
	for _, p := range peers {
		if p.node.peer.HostsShard(layout.FirstLockShard) {
			host = p.node
		} else if watcher == nil {
			watcher = p.node
		}
	}
	if host == nil || watcher == nil {
		t.Fatal("no host and non-host of the lock shard")
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	ch, err := watcher.Watch(wctx, "far")
	if err != nil {
		t.Fatal(err)
	}
	last := next(t, ch).Index
	tokens := map[uint64]bool{}
	lockOnce := func(n *Node) {
		l, err := n.Lock(ctx, "far")
		if err != nil {
			t.Fatal(err)
		}
		tokens[l.Token()] = true
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lockOnce(host)
	// The host leaves: the shard's replica moves to another peer, and the
	// watch resumes there after the last index it delivered.
	if err := host.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	lockOnce(watcher)
	for len(tokens) > 0 {
		r := next(t, ch)
		if r.Index <= last {
			t.Fatalf("index %d after %d", r.Index, last)
		}
		last = r.Index
		for _, e := range r.Events {
			if e.Kind == Granted {
				delete(tokens, e.Holder.Token)
			}
		}
		if r.Resync {
			// The new host was sent a snapshot, and its journal begins
			// there: the watch says so rather than skip, and what came
			// before is in the state it carries.
			t.Logf("resynced at index %d after the host left: %+v", r.Index, r.Keys)
			break
		}
	}
}

// InspectPrefix pages through the keys of a hash tag in key order, each
// page one read; bad prefixes, limits and cursors are refused.
func TestInspectPrefix(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	s1, s2 := newTestSession(t, ctx, n), newTestSession(t, ctx, n)
	var want []string
	for i := range 25 {
		key := fmt.Sprintf("{inv}/%02d", i)
		if _, err := s1.Lock(ctx, key, WithValue([]byte(key))); err != nil {
			t.Fatal(err)
		}
		want = append(want, key)
	}
	if _, err := s1.Lock(ctx, "{other}/00"); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = s2.Lock(ctx, "{inv}/07") }()
	waitQueued(t, n, "{inv}/07", 1)

	var got []string
	cursor, pages := "", 0
	for {
		keys, next, err := n.InspectPrefix(ctx, "{inv}/", cursor, 10)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, k := range keys {
			got = append(got, k.Key)
			if len(k.Holders) != 1 || string(k.Holders[0].Value) != k.Key || k.Holders[0].Session != s1.ID() {
				t.Fatalf("%s: holders %+v, want s1 holding it with its value", k.Key, k.Holders)
			}
			if k.Key == "{inv}/07" && (len(k.Waiters) != 1 || k.Waiters[0].Session != s2.ID()) {
				t.Fatalf("{inv}/07: waiters %+v, want s2", k.Waiters)
			}
		}
		if next == "" {
			break
		}
		cursor = next
	}
	if !slices.Equal(got, want) || pages != 3 {
		t.Fatalf("%d pages of %v, want 3 of %v", pages, got, want)
	}
	for _, tc := range []struct {
		prefix, cursor string
		limit          int
		want           error
	}{
		{"inv/", "", 10, ErrInvalidArgument},
		{"{inv}/", "", MaxInspectKeys + 1, ErrInvalidArgument},
		{"{inv}/", "", -1, ErrInvalidArgument},
		{"{inv}/", "a", 10, ErrInvalidArgument},
		{"", "", 10, ErrInvalidKey},
	} {
		if _, _, err := n.InspectPrefix(ctx, tc.prefix, tc.cursor, tc.limit); !errors.Is(err, tc.want) {
			t.Errorf("InspectPrefix(%q, %q, %d): %v, want %v", tc.prefix, tc.cursor, tc.limit, err, tc.want)
		}
	}
}

// Inspect says what each hold is: three readers with a writer queued are
// three read holds and a write wait, and a semaphore's holds their
// permits.
func TestInspectSaysTheKind(t *testing.T) {
	n, ctx := startPromiseCluster(t)
	for range 3 {
		if _, err := newTestSession(t, ctx, n).RWMutex("rw").RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _, _ = newTestSession(t, ctx, n).RWMutex("rw").Lock(ctx) }()
	waitQueued(t, n, "rw", 1)
	info, err := n.Inspect(ctx, "rw")
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, h := range append(info.Holders, info.Waiters...) {
		kinds = append(kinds, h.Kind)
	}
	if got := strings.Join(kinds, " "); got != "read read read write" {
		t.Fatalf("kinds %q, want three reads holding and a write waiting", got)
	}
	if _, err := newTestSession(t, ctx, n).Semaphore("pool", 5).Acquire(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if info, err := n.Inspect(ctx, "pool"); err != nil || info.Holders[0].Kind != "semaphore" || info.Holders[0].Permits != 3 {
		t.Fatalf("the semaphore's holder %+v, %v, want 3 permits of a semaphore", info.Holders, err)
	}
}

// After two of three peers die, the survivor's Status tells the truth:
// no leader for any shard once its replicas know none, and not Ready,
// rather than the leaders it last heard of.
func TestStatusAfterQuorumLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three peers and kills two")
	}
	logs := newLogRecorder()
	peers := startCluster(t, clusterOpts{peers: 3, rf: 3, shards: 2, ttl: 2 * time.Second, mutate: func(c *Config) {
		if c.Name == "peer-1" {
			c.Logger = slog.New(logs)
		}
	}})
	ctx := ctxT(t, time.Minute)
	var st Status
	var err error
	pollUntil(t, 30*time.Second, "a healthy cluster's Status to be ready, with a leader for every shard", func() bool {
		st, err = peers[0].node.Status(ctx)
		return err == nil && st.Ready && !slices.ContainsFunc(st.Shards, func(s ShardStatus) bool { return s.Leader == "" })
	})
	peers[1].node.peer.Kill()
	peers[2].node.peer.Kill()
	pollUntil(t, 30*time.Second, "the survivor's Status to show no leaders and not ready", func() bool {
		st, err = peers[0].node.Status(ctx)
		if err != nil || st.Ready {
			return false
		}
		for _, s := range st.Shards {
			if s.Leader != "" {
				return false
			}
		}
		return true
	})
	// And it says so where operators look: a warning for each lock shard
	// without a leader (after 5 s).
	pollUntil(t, 30*time.Second, "a warning for each lock shard without a leader", func() bool {
		return logs.count(slog.LevelWarn, "shard has no leader: its locks wait until a quorum of its replicas is back") >= 2
	})
}
