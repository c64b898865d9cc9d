package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	otelresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/lockmesh/lockmesh/internal/level"
)

// observedCluster is a 3-peer cluster whose peers record metrics (one
// reader each) and traces (one recorder, each span with its peer's name
// as a resource attribute).
func observedCluster(t *testing.T) ([]*testPeer, []*sdkmetric.ManualReader, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	readers := make([]*sdkmetric.ManualReader, 3)
	peers := startClusterWith(t, clusterOpts{peers: 3, ttl: 2 * time.Second}, func(i int, c *Config) {
		readers[i] = sdkmetric.NewManualReader()
		c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(readers[i]))
		c.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec),
			sdktrace.WithResource(otelresource.NewSchemaless(attribute.String("peer", c.Name))))
	})
	return peers, readers, rec
}

// collect reads every metric of r by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// histogramCount is the number of values recorded in histogram m whose
// attributes include every one of want.
func histogramCount(m metricdata.Metrics, want ...attribute.KeyValue) uint64 {
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		return 0
	}
	var n uint64
	for _, dp := range h.DataPoints {
		if hasAll(dp.Attributes, want) {
			n += dp.Count
		}
	}
	return n
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// attributesOf lists every attribute set of every data point of m.
func attributesOf(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, dp.Attributes)
		}
	}
	return out
}

// TestObservability drives a contended key and a forwarded lock through
// a cluster that records metrics and traces, and checks what an operator
// reads: Inspect's ages, Top's contended key, hand-off and long hold,
// Status's shards, the metrics (and that no metric names a key), and one
// trace spanning two peers for a forwarded Lock.
func TestObservability(t *testing.T) {
	peers, readers, rec := observedCluster(t)
	n1, n2, n3 := peers[0].node, peers[1].node, peers[2].node
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	began := time.Now()

	const hot = "observed/hot"
	l, err := n1.Lock(ctx, hot)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock, 2)
	for _, n := range []*Node{n2, n3} {
		go func() {
			l, err := n.Lock(ctx, hot)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
	}
	var info KeyInfo
	for len(info.Waiters) < 2 {
		if info, err = n1.Inspect(ctx, hot); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(began)
	for _, h := range append(slices.Clone(info.Holders), info.Waiters...) {
		if h.Age <= 0 || h.Age > elapsed || h.AtLeast {
			t.Errorf("Inspect: %s's age %v (at least: %v), want a known age within the %v since the test began", h.Peer, h.Age, h.AtLeast, elapsed)
		}
	}

	top, err := n3.Top(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Missing) != 0 || len(top.Contended) == 0 || top.Contended[0].Key != hot || top.Contended[0].Waiters != 2 {
		t.Fatalf("Top while 2 wait: %+v", top)
	}
	if len(top.LongestHolds) == 0 || top.LongestHolds[0].Key != hot || top.LongestHolds[0].Peer != "peer-1" || top.LongestHolds[0].Token != l.Token() {
		t.Fatalf("Top's longest holds %+v, want %s held by peer-1 with token %d", top.LongestHolds, hot, l.Token())
	}

	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	next := <-got
	if err := next.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := <-got
	if top, err = n1.Top(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if len(top.Contended) == 0 || top.Contended[0].Key != hot || top.Contended[0].Handoffs < 1 || top.Contended[0].TotalWait <= 0 {
		t.Fatalf("Top after the hand-offs: %+v", top.Contended)
	}
	if err := last.Release(); err != nil {
		t.Fatal(err)
	}

	// Ready needs a known leader of every lock shard, which an election
	// may hold up for a moment.
	var st Status
	pollUntil(t, 20*time.Second, "Status to say ready", func() bool {
		var err error
		st, err = n2.Status(ctx)
		return err == nil && st.Ready
	})
	if st.Level != uint8(level.Max) || len(st.Members) != 3 || len(st.Shards) != 4 {
		t.Fatalf("Status: %+v", st)
	}
	for _, sh := range st.Shards {
		if !sh.Counted || len(sh.Replicas) != 3 {
			t.Errorf("shard %d: %+v", sh.Shard, sh)
		}
		for _, r := range sh.Replicas {
			if !r.Reported || r.Applied == 0 {
				t.Errorf("shard %d replica on %s not reported: %+v", sh.Shard, r.Peer, r)
			}
		}
	}

	// A lock whose session is lost: its Unlock's span says so, and the
	// loss is counted by reason.
	sess, err := n1.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := sess.Lock(ctx, "observed/lost")
	if err != nil {
		t.Fatal(err)
	}
	lost.h.Session().Lose(fmt.Errorf("%w: lost by the test", ErrLeaseExpired))
	if err := lost.Unlock(ctx); !errors.Is(err, ErrLeaseExpired) {
		t.Fatalf("Unlock of a lost lock: %v", err)
	}
	if !slices.ContainsFunc(rec.Ended(), func(s sdktrace.ReadOnlySpan) bool {
		return s.Name() == "lockmesh.Unlock" && slices.ContainsFunc(s.Events(), func(e sdktrace.Event) bool { return e.Name == "lease lost" })
	}) {
		t.Error("no Unlock span with a lease lost event")
	}

	// A forwarded Lock: a key whose shard another peer leads. Leadership
	// may move while the cluster evens it out, so try keys until a Lock
	// is served by another peer.
	var trace []sdktrace.ReadOnlySpan
	for i := 0; i < 50 && trace == nil; i++ {
		key := fmt.Sprintf("observed/forwarded/%d", i)
		if leader := n1.peer.LeaderGuess(n1.peer.Placement().ShardOf(key)); leader == "" || leader == "peer-1" {
			continue
		}
		l, err := n1.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		trace = spansOfLock(rec.Ended(), key)
	}
	if trace == nil {
		t.Fatal("no Lock of 50 keys led elsewhere was served by another peer")
	}

	// Keepalives go out every quarter TTL: wait for peer-1's first.
	for histogramCount(collect(t, readers[0])["lockmesh.keepalive.duration"]) == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("no keepalive recorded")
		case <-time.After(50 * time.Millisecond):
		}
	}
	m1, m2 := collect(t, readers[0]), collect(t, readers[1])
	for _, c := range []struct {
		m    map[string]metricdata.Metrics
		name string
		want []attribute.KeyValue
	}{
		{m1, "lockmesh.acquire.duration", []attribute.KeyValue{attribute.String("primitive", "mutex"), attribute.String("result", "granted")}},
		{m1, "lockmesh.hold.duration", []attribute.KeyValue{attribute.String("primitive", "mutex")}},
		{m2, "lockmesh.wait.duration", []attribute.KeyValue{attribute.String("primitive", "mutex")}},
		{m1, "lockmesh.proposal.duration", []attribute.KeyValue{attribute.String("path", "forwarded")}},
		{m1, "lockmesh.raft.log.sync.duration", nil},
		{m1, "lockmesh.keepalive.duration", nil},
	} {
		if histogramCount(c.m[c.name], c.want...) == 0 {
			t.Errorf("%s has no values with %v", c.name, c.want)
		}
	}
	if lostCount(m1["lockmesh.lease.lost"], "other") != 1 || lostCount(m1["lockmesh.lease.lost.locks"], "other") != 1 {
		t.Errorf("lease losses: %+v, %+v; want 1 session and 1 lock lost for reason other", m1["lockmesh.lease.lost"].Data, m1["lockmesh.lease.lost.locks"].Data)
	}
	for _, name := range []string{"lockmesh.raft.entries", "lockmesh.shard.has_leader", "lockmesh.gossip.members", "lockmesh.shard.leader.changes"} {
		if len(attributesOf(m1[name])) == 0 {
			t.Errorf("no %s", name)
		}
	}
	// The shards' grants come from their leaders, whoever locked.
	grants := 0
	for _, m := range []map[string]metricdata.Metrics{m1, m2, collect(t, readers[2])} {
		grants += len(attributesOf(m["lockmesh.shard.grants"]))
	}
	if grants == 0 {
		t.Error("no peer reported lockmesh.shard.grants")
	}
	for _, m := range []map[string]metricdata.Metrics{m1, m2, collect(t, readers[2])} {
		for name, mm := range m {
			for _, set := range attributesOf(mm) {
				for _, kv := range set.ToSlice() {
					if kv.Key == "key" || kv.Key == "lockmesh.key" || kv.Value.Emit() == hot {
						t.Errorf("%s has a key attribute: %v", name, set)
					}
				}
			}
		}
	}
}

// spansOfLock returns the spans of the trace of the Lock of key when they
// were made on at least two peers, else nil.
func spansOfLock(spans []sdktrace.ReadOnlySpan, key string) []sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() != "lockmesh.Lock" || !hasAll(attribute.NewSet(s.Attributes()...), []attribute.KeyValue{attribute.String("lockmesh.key", key)}) {
			continue
		}
		var trace []sdktrace.ReadOnlySpan
		peers := map[string]bool{}
		for _, o := range spans {
			if o.SpanContext().TraceID() == s.SpanContext().TraceID() {
				trace = append(trace, o)
				peer, _ := o.Resource().Set().Value("peer")
				peers[peer.AsString()] = true
			}
		}
		if len(peers) >= 2 {
			return trace
		}
	}
	return nil
}

// lostCount is the value of counter m for reason.
func lostCount(m metricdata.Metrics, reason string) int64 {
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range sum.DataPoints {
		if v, ok := dp.Attributes.Value("reason"); ok && v.AsString() == reason {
			n += dp.Value
		}
	}
	return n
}

// Metrics may be collected at any time: while a peer starts, before it
// has a mesh or replicas, and while it closes. Collections run in a loop
// through a peer's whole life and must neither fail nor panic.
func TestMetricsCollectedThroughStartAndClose(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	// The provider registers the reader: a Collect before that fails
	// ("reader is not registered") whatever the peer does.
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	done := make(chan struct{})
	collected := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				collected <- n
				return
			default:
			}
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(context.Background(), &rm); err != nil {
				t.Errorf("collect: %v", err)
			}
			n++
		}
	}()
	peers := startClusterWith(t, clusterOpts{peers: 1}, func(_ int, c *Config) {
		c.MeterProvider = provider
	})
	if _, err := peers[0].node.Lock(context.Background(), "collected"); err != nil {
		t.Fatal(err)
	}
	peers[0].stop()
	close(done)
	if n := <-collected; n < 2 {
		t.Fatalf("only %d collections ran during the peer's life", n)
	}
}
