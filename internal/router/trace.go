package router

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracing of proposals. A command proposed from a traced context (its
// caller's span is sampled) gets a span for its proposal on this peer;
// when the batch is forwarded, the request carries each traced command's
// span context (W3C traceparent), and the serving peer continues the
// trace, so a forwarded Lock is one trace across peers. Untraced
// commands cost nothing beyond a check of their context.

// TraceRef is the trace context of one command of a forwarded batch: the
// index of the first command of its unit (a command or a group) and its
// W3C traceparent.
type TraceRef struct {
	Cmd    int    `msgpack:"i"`
	Parent string `msgpack:"p"`
}

// maxTraceParent bounds a traceparent read from the network; a valid one
// has 55 characters.
const maxTraceParent = 128

var traceContext propagation.TraceContext

func (r *Router) tracer() trace.Tracer {
	if r.cfg.Tracer == nil {
		return noop.Tracer{}
	}
	return r.cfg.Tracer
}

// spanned reports the sampled span context ctx carries, if any.
func spanned(ctx context.Context) (trace.SpanContext, bool) {
	sc := trace.SpanContextFromContext(ctx)
	return sc, sc.IsValid() && sc.IsSampled()
}

// batchSpans are the spans of the traced commands of one batch.
type batchSpans struct {
	spans []trace.Span
	refs  []TraceRef
}

// start starts a span named name for each traced RequestState of batch,
// child of its caller's span; forwarded records their trace contexts for
// the request.
func (r *Router) startSpans(shard uint64, batch []*RequestState, name string, kind trace.SpanKind) *batchSpans {
	var bs *batchSpans
	cmd := 0
	for _, rs := range batch {
		if rs.trace.IsValid() {
			if bs == nil {
				bs = &batchSpans{}
			}
			ctx := trace.ContextWithSpanContext(context.Background(), rs.trace)
			ctx, span := r.tracer().Start(ctx, name, trace.WithSpanKind(kind),
				trace.WithAttributes(attribute.Int64("lockmesh.shard", int64(shard)),
					attribute.Int("lockmesh.batch.commands", batchSize(batch))))
			bs.spans = append(bs.spans, span)
			carrier := propagation.MapCarrier{}
			traceContext.Inject(ctx, carrier)
			bs.refs = append(bs.refs, TraceRef{Cmd: cmd, Parent: carrier.Get("traceparent")})
		}
		cmd += len(rs.cmds)
	}
	return bs
}

func batchSize(batch []*RequestState) int {
	n := 0
	for _, rs := range batch {
		n += len(rs.cmds)
	}
	return n
}

// end ends the spans, marking them failed with err.
func (bs *batchSpans) end(err error) {
	if bs == nil {
		return
	}
	for _, s := range bs.spans {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, err.Error())
		}
		s.End()
	}
}

// traceRefs is what a forwarded request carries of bs.
func (bs *batchSpans) traceRefs() []TraceRef {
	if bs == nil {
		return nil
	}
	return bs.refs
}

// remoteTraces maps the first command index of each unit of a served
// batch to the context continuing its sender's trace. refs come from the
// network: malformed or out of range ones are ignored.
func remoteTraces(refs []TraceRef, ncmds int) map[int]trace.SpanContext {
	var out map[int]trace.SpanContext
	for _, ref := range refs {
		if ref.Cmd < 0 || ref.Cmd >= ncmds || len(ref.Parent) > maxTraceParent {
			continue
		}
		ctx := traceContext.Extract(context.Background(), propagation.MapCarrier{"traceparent": ref.Parent})
		sc := trace.SpanContextFromContext(ctx)
		if !sc.IsValid() {
			continue
		}
		if out == nil {
			out = map[int]trace.SpanContext{}
		}
		out[ref.Cmd] = sc
	}
	return out
}

// observe reports one proposal's duration to Config.OnProposed.
func (r *Router) observe(shard uint64, forwarded bool, start time.Time, err error) {
	if r.cfg.OnProposed != nil {
		r.cfg.OnProposed(shard, forwarded, time.Since(start), err)
	}
}
