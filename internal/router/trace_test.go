package router

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// forwardedPair is a peer d that hosts nothing and forwards to b, which
// hosts the shard; each has its own tracer, recording into one recorder.
func forwardedPair(t *testing.T, carry bool) (d *Router, rec *tracetest.SpanRecorder, seen *[]ProposeRequest) {
	t.Helper()
	rec = tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p := threePeers()
	if carry {
		p.Level = uint32(level.Family)
	}
	p.Peers = append(p.Peers, layout.Peer{Name: "d"})
	bHost := &fakeHost{p: p, hosted: true}
	b := New(Config{Name: "b", RTT: time.Millisecond, ProposeMethod: 1, Tracer: tp.Tracer("b")}, bHost)
	t.Cleanup(b.Close)
	seen = &[]ProposeRequest{}
	peers := &fakePeers{f: func(addr string, body []byte) ([]byte, error) {
		var req ProposeRequest
		if err := msgpack.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		*seen = append(*seen, req)
		return b.ServePropose(context.Background(), req)
	}}
	d = New(Config{Name: "d", RTT: time.Millisecond, Peers: peers, ProposeMethod: 1, Tracer: tp.Tracer("d")}, &fakeHost{p: p})
	t.Cleanup(d.Close)
	d.SetLeader(shard, "b")
	return d, rec, seen
}

// A command proposed from a sampled span and forwarded to the leader's
// peer is one trace: the caller's span, the forward on this peer, and the
// serving and the proposal on the other, each the child of the one before.
func TestForwardedProposalIsOneTrace(t *testing.T) {
	d, rec, seen := forwardedPair(t, true)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, caller := tp.Tracer("app").Start(context.Background(), "caller")
	if _, err := d.Apply(ctx, shard, acquire(7)); err != nil {
		t.Fatal(err)
	}
	caller.End()
	if len(*seen) != 1 || len((*seen)[0].Traces) != 1 || !strings.HasPrefix((*seen)[0].Traces[0].Parent, "00-") {
		t.Fatalf("forwarded requests %+v, want one carrying a traceparent", *seen)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	chain := []string{"caller", "lockmesh.forward", "lockmesh.serve_propose", "lockmesh.propose"}
	kinds := []trace.SpanKind{trace.SpanKindInternal, trace.SpanKindClient, trace.SpanKindServer, trace.SpanKindInternal}
	for i, name := range chain {
		s, ok := spans[name]
		if !ok {
			t.Fatalf("no span %q among %d", name, len(spans))
		}
		if s.SpanContext().TraceID() != caller.SpanContext().TraceID() {
			t.Errorf("%s is in trace %v, want the caller's %v", name, s.SpanContext().TraceID(), caller.SpanContext().TraceID())
		}
		if s.SpanKind() != kinds[i] {
			t.Errorf("%s is a %v span, want %v", name, s.SpanKind(), kinds[i])
		}
		if i > 0 && s.Parent().SpanID() != spans[chain[i-1]].SpanContext().SpanID() {
			t.Errorf("%s's parent is not %s", name, chain[i-1])
		}
	}
}

// Below feature level 3 (level.CarriesTraces false) a forwarded request carries
// no trace contexts, which older peers would not expect; an untraced
// caller costs no span at all.
func TestTracesAreCarriedOnlyWhenAllowed(t *testing.T) {
	d, rec, seen := forwardedPair(t, false)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, caller := tp.Tracer("app").Start(context.Background(), "caller")
	if _, err := d.Apply(ctx, shard, acquire(7)); err != nil {
		t.Fatal(err)
	}
	caller.End()
	if len(*seen) != 1 || (*seen)[0].Traces != nil {
		t.Fatalf("forwarded requests %+v, want one without traces", *seen)
	}
	for _, s := range rec.Ended() {
		if s.Name() == "lockmesh.serve_propose" {
			t.Fatalf("the serving peer continued a trace it was not sent")
		}
	}
	before := len(rec.Ended())
	if _, err := d.Apply(context.Background(), shard, acquire(8)); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()) - before; n != 0 {
		t.Fatalf("an untraced command made %d spans", n)
	}
}

// Trace contexts come from the network: malformed, oversized or out of
// range ones are ignored, and the proposal is served.
func TestServeProposeIgnoresBadTraceContexts(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h := &fakeHost{p: threePeers(), hosted: true}
	r := New(Config{Name: "a", RTT: time.Millisecond, ProposeMethod: 1, Tracer: tp.Tracer("a")}, h)
	defer r.Close()
	data, err := lockfsm.EncodeCommandsFormat(lockfsm.FormatTagged, []lockfsm.Command{acquire(1)})
	if err != nil {
		t.Fatal(err)
	}
	valid := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	bad := []TraceRef{{Cmd: 0, Parent: "garbage"}, {Cmd: 5, Parent: valid}, {Cmd: -1, Parent: valid},
		{Cmd: 0, Parent: valid + strings.Repeat("x", 200)}}
	if _, err := r.ServePropose(context.Background(), ProposeRequest{Shard: shard, Cmds: data, Level: 3, Traces: bad}); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans from bad trace contexts", n)
	}
}
