package node

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	vmetrics "github.com/VictoriaMetrics/metrics"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/release"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// Metrics and traces (docs/OBSERVABILITY.md). The providers come from
// Config; lockmesh installs no global provider. No metric has a key as an
// attribute: keys are unbounded, and a metric series per key would grow
// without bound. Shards are bounded and label what is per shard.

// instrumentationName names lockmesh's meter and tracer.
const instrumentationName = "github.com/lockmesh/lockmesh/node"

// primitive is what an acquire takes: the "primitive" attribute.
type primitive uint8

const (
	primitiveMutex primitive = iota
	primitiveRead
	primitiveWrite
	primitiveSemaphore
	primitiveMulti
)

var primitiveNames = [...]string{"mutex", "read", "write", "semaphore", "multi"}

func (p primitive) String() string { return primitiveNames[p] }

// Attribute values of lockmesh's acquire results.
const (
	resultGranted  = "granted"
	resultRefused  = "refused"
	resultTimeout  = "timeout"
	resultCanceled = "canceled"
	resultError    = "error"
)

// latencyBuckets are the histogram boundaries, in seconds, of every
// latency lockmesh records: from a local fsync to a long wait.
var latencyBuckets = []float64{0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05,
	0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 300}

// telemetry is a peer's instruments and tracer: no-ops unless Config
// gives providers.
type telemetry struct {
	on     bool // a MeterProvider was given: time holds
	traced bool // a TracerProvider was given
	tracer trace.Tracer

	acquire, wait, hold, keepAlive, propose, logSync metric.Float64Histogram
	leaseLost, locksLost, leaderChanges              metric.Int64Counter

	meter        metric.Meter
	observed     observedInstruments
	mu           sync.Mutex
	registration metric.Registration // set by register, ended by close

	// startCommits is, per shard, the commit index the local replica's
	// Raft state recorded when it started (replicas.Config.OnRaftState).
	startCommits sync.Map
}

// epoch is the origin of Lock.granted: a monotonic reading.
var epoch = time.Now()

func sinceEpoch() int64 { return int64(time.Since(epoch)) }

// newTelemetry makes a peer's instruments from its Config's providers.
func newTelemetry(cfg Config) (*telemetry, error) {
	mp, tp := cfg.MeterProvider, cfg.TracerProvider
	t := &telemetry{on: mp != nil, traced: tp != nil}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	}
	version := trace.WithInstrumentationVersion(release.Version)
	t.tracer = tp.Tracer(instrumentationName, version)
	m := mp.Meter(instrumentationName, metric.WithInstrumentationVersion(release.Version))
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(latencyBuckets...))
		errs = append(errs, err)
		return h
	}
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	t.acquire = hist("lockmesh.acquire.duration", "Time from an acquire call to its outcome, by primitive and result.")
	t.wait = hist("lockmesh.wait.duration", "Time acquires that queued spent waiting for their grant, by primitive.")
	t.hold = hist("lockmesh.hold.duration", "Time from a grant to its Unlock or Release, by primitive.")
	t.keepAlive = hist("lockmesh.keepalive.duration", "Round trip of a keepalive to a shard leader, by shard.")
	t.propose = hist("lockmesh.proposal.duration", "Time to commit a batch of commands, by path (local or forwarded) and shard.")
	t.logSync = hist("lockmesh.raft.log.sync.duration", "Time of each synced write of the Raft log (the write and its fsync).")
	t.leaseLost = counter("lockmesh.lease.lost", "{session}", "Replicated sessions this peer lost, by reason; their locks ended with ErrLeaseExpired.")
	t.locksLost = counter("lockmesh.lease.lost.locks", "{lock}", "Locks held by the sessions lost, by reason.")
	t.leaderChanges = counter("lockmesh.shard.leader.changes", "{change}", "Leader changes this peer's replicas saw, by shard.")

	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		opts := []metric.Int64ObservableGaugeOption{metric.WithDescription(desc)}
		if unit != "" {
			opts = append(opts, metric.WithUnit(unit))
		}
		g, err := m.Int64ObservableGauge(name, opts...)
		errs = append(errs, err)
		return g
	}
	obsCounter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	entries := obsCounter("lockmesh.raft.entries", "{entry}", "Lock shard Raft entries this peer's replicas applied.")
	commands := obsCounter("lockmesh.raft.commands", "{command}", "Lock commands in those entries; commands/entries is the batching.")
	grants := obsCounter("lockmesh.shard.grants", "{grant}", "Grants each shard this peer leads has made since it began (its fencing tokens issued): every peer's locks, so scraping the leaders is enough.")
	sessions := gauge("lockmesh.shard.sessions", "{session}", "Live sessions of each shard this peer leads.")
	keys := gauge("lockmesh.shard.keys", "{key}", "Keys held or waited for, per shard this peer leads.")
	holders := gauge("lockmesh.shard.holders", "{holder}", "Holders, per shard this peer leads.")
	waiters := gauge("lockmesh.shard.waiters", "{waiter}", "Waiters, per shard this peer leads.")
	// No unit: the Prometheus exporter would name a unit of "1" a ratio.
	leader := gauge("lockmesh.shard.has_leader", "", "1 when the shard of a replica on this peer knows its leader, 0 while it has none.")
	members := gauge("lockmesh.gossip.members", "{peer}", "Peers by state: alive, or failed (in the layout, not seen alive by gossip).")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	t.meter = m
	t.observed = observedInstruments{entries: entries, commands: commands, grants: grants, sessions: sessions, keys: keys,
		holders: holders, waiters: waiters, leader: leader, members: members}
	return t, nil
}

// observedInstruments are the instruments read at collection time.
type observedInstruments struct {
	entries, commands, grants                         metric.Int64ObservableCounter
	sessions, keys, holders, waiters, leader, members metric.Int64ObservableGauge
}

// register starts answering collections of the observed instruments
// from n, once Start has opened it: the callback reads the mesh and the
// replicas, which exist only from then on. close stops it.
func (t *telemetry) register(n *Node) error {
	in := t.observed
	entries, commands, grants, sessions, keys, holders, waiters, leader, members := in.entries, in.commands, in.grants,
		in.sessions, in.keys, in.holders, in.waiters, in.leader, in.members
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st := n.Stats()
		o.ObserveInt64(entries, int64(st.RaftEntries))
		o.ObserveInt64(commands, int64(st.Commands))
		alive, failed := 0, 0
		for _, mem := range n.Members() {
			if mem.Alive {
				alive++
			} else {
				failed++
			}
		}
		o.ObserveInt64(members, int64(alive), metric.WithAttributes(attribute.String("state", "alive")))
		o.ObserveInt64(members, int64(failed), metric.WithAttributes(attribute.String("state", "failed")))
		for _, sh := range n.peer.LocalShards() {
			shardAttr := metric.WithAttributes(shardAttribute(sh.Shard))
			o.ObserveInt64(leader, boolInt(sh.LeaderKnown), shardAttr)
			if !sh.Leading {
				continue
			}
			c, ok := n.peer.LocalCounts(sh.Shard)
			if !ok {
				continue
			}
			o.ObserveInt64(sessions, int64(c.Sessions), shardAttr)
			o.ObserveInt64(keys, int64(c.Keys), shardAttr)
			o.ObserveInt64(holders, int64(c.Holders), shardAttr)
			o.ObserveInt64(waiters, int64(c.Waiters), shardAttr)
			o.ObserveInt64(grants, int64(max(c.NextToken, 1)-1), shardAttr)
		}
		return nil
	}, entries, commands, grants, sessions, keys, holders, waiters, leader, members)
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.registration = reg
	t.mu.Unlock()
	return nil
}

// Close unregisters the callback of the observed metrics.
func (t *telemetry) Close() {
	t.mu.Lock()
	reg := t.registration
	t.registration = nil
	t.mu.Unlock()
	if reg != nil {
		_ = reg.Unregister()
	}
}

func shardAttribute(shard uint64) attribute.KeyValue {
	return attribute.Int64("shard", int64(shard))
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// primitiveOf names the primitive an acquire of spec takes.
func primitiveOf(spec client.Spec) primitive {
	switch spec.Kind {
	case lockfsm.KindRead:
		return primitiveRead
	case lockfsm.KindWrite:
		return primitiveWrite
	case lockfsm.KindSemaphore:
		return primitiveSemaphore
	}
	return primitiveMutex
}

// spanName names the span of an acquire of primitive; wait is false for
// the Try forms.
func spanName(p primitive, wait bool) string {
	name := [...]string{primitiveMutex: "Lock", primitiveWrite: "Lock", primitiveRead: "RLock",
		primitiveSemaphore: "Acquire", primitiveMulti: "LockAll"}[p]
	if !wait {
		name = "Try" + name
	}
	return "lockmesh." + name
}

// resultOf classifies an acquire's error for the acquire metric.
func resultOf(err error) string {
	var le *LockedError
	switch {
	case err == nil:
		return resultGranted
	case errors.As(err, &le), errors.Is(err, ErrLocked), errors.Is(err, ErrDeadlock),
		errors.Is(err, ErrKindMismatch), errors.Is(err, ErrLimitMismatch), errors.Is(err, ErrAlreadyHeld):
		return resultRefused
	case errors.Is(err, context.DeadlineExceeded):
		return resultTimeout
	case errors.Is(err, context.Canceled):
		return resultCanceled
	}
	return resultError
}

// acquireCall is one acquire being observed: its span, its start, and
// when it queued (set by the client's OnQueued through the context).
type acquireCall struct {
	t         *telemetry
	span      trace.Span
	primitive primitive
	start     time.Time
	mu        sync.Mutex
	queued    time.Time
}

type acquireCallKey struct{}

// enabled reports whether any provider was given: without one, calls
// skip their spans and timings altogether.
func (t *telemetry) enabled() bool { return t.on || t.traced }

// The peer reports to its telemetry (internal/peer.Observer).
var _ peer.Observer = (*telemetry)(nil)

// Tracer is the tracer of lock calls and their proposals.
func (t *telemetry) Tracer() trace.Tracer { return t.tracer }

// TimesSyncs reports whether a MeterProvider times the Raft log's syncs.
func (t *telemetry) TimesSyncs() bool { return t.on }

// startAcquire starts observing an acquire of key(s) as primitive. The
// returned context carries the span and the call.
func (t *telemetry) startAcquire(ctx context.Context, p primitive, wait bool, keys ...string) (context.Context, *acquireCall) {
	if !t.enabled() {
		return ctx, nil // whose end does nothing
	}
	c := &acquireCall{t: t, primitive: p, start: time.Now()}
	attrs := []attribute.KeyValue{attribute.String("lockmesh.primitive", p.String())}
	if len(keys) == 1 {
		attrs = append(attrs, attribute.String("lockmesh.key", keys[0]))
	} else {
		attrs = append(attrs, attribute.StringSlice("lockmesh.keys", keys))
	}
	ctx, c.span = t.tracer.Start(ctx, spanName(p, wait), trace.WithAttributes(attrs...))
	return context.WithValue(ctx, acquireCallKey{}, c), c
}

// OnQueued is the client's OnQueued: the acquire of ctx queued.
func (t *telemetry) OnQueued(ctx context.Context) {
	c, ok := ctx.Value(acquireCallKey{}).(*acquireCall)
	if !ok {
		return
	}
	c.mu.Lock()
	c.queued = time.Now()
	c.mu.Unlock()
	c.span.AddEvent("queued")
}

// endLock is end of an acquire of one lock, l (nil when it failed).
func (c *acquireCall) endLock(ctx context.Context, l *Lock, err error) {
	if c == nil {
		return
	}
	var locks []*Lock
	if l != nil {
		locks = []*Lock{l}
	}
	c.end(ctx, locks, err)
}

// end records the acquire's outcome: the granted locks (for their
// shards and tokens) or the error.
func (c *acquireCall) end(ctx context.Context, locks []*Lock, err error) {
	if c == nil {
		return
	}
	now := time.Now()
	result := resultOf(err)
	attrs := metric.WithAttributes(attribute.String("primitive", c.primitive.String()), attribute.String("result", result))
	c.t.acquire.Record(ctx, now.Sub(c.start).Seconds(), attrs)
	c.mu.Lock()
	queued := c.queued
	c.mu.Unlock()
	if !queued.IsZero() {
		c.t.wait.Record(ctx, now.Sub(queued).Seconds(), metric.WithAttributes(attribute.String("primitive", c.primitive.String())))
	}
	if err != nil {
		leaseLostEvent(c.span, err)
		c.span.RecordError(err)
		c.span.SetStatus(codes.Error, result)
	} else {
		granted := sinceEpoch()
		for _, l := range locks {
			l.primitive = c.primitive
			if c.t.on {
				l.granted = granted
			}
		}
		if len(locks) == 1 {
			c.span.SetAttributes(attribute.Int64("lockmesh.shard", int64(locks[0].h.Shard())),
				attribute.String("lockmesh.token", strconv.FormatUint(locks[0].Token(), 10)))
		}
		c.span.AddEvent("granted")
	}
	c.span.SetAttributes(attribute.String("lockmesh.result", result))
	c.span.End()
}

// startRelease starts the span of an Unlock or Release of l.
func (t *telemetry) startRelease(ctx context.Context, name string, l *Lock) (context.Context, trace.Span) {
	return t.tracer.Start(ctx, name, trace.WithAttributes(
		attribute.String("lockmesh.key", l.Key()), attribute.Int64("lockmesh.shard", int64(l.h.Shard())),
		attribute.String("lockmesh.token", strconv.FormatUint(l.Token(), 10))))
}

// endRelease ends a release's span and records the hold time of l.
func (t *telemetry) endRelease(ctx context.Context, span trace.Span, l *Lock, err error) {
	if l.granted != 0 {
		held := time.Duration(sinceEpoch() - l.granted)
		t.hold.Record(ctx, held.Seconds(), metric.WithAttributes(attribute.String("primitive", l.primitive.String())))
	}
	if err != nil {
		leaseLostEvent(span, err)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// leaseLostEvent marks span with a "lease lost" event when err says the
// call's session was lost (a wait that lost it, or a lock lost before
// its release).
func leaseLostEvent(span trace.Span, err error) {
	if errors.Is(err, ErrLeaseExpired) {
		span.AddEvent("lease lost", trace.WithAttributes(attribute.String("lockmesh.reason", client.LossReason(err))))
	}
}

// OnLost is the client's OnLost: a session of this peer was lost.
func (t *telemetry) OnLost(shard uint64, locks int, reason string) {
	attrs := metric.WithAttributes(attribute.String("reason", reason))
	t.leaseLost.Add(context.Background(), 1, attrs)
	t.locksLost.Add(context.Background(), int64(locks), attrs)
}

// OnProposed is the router's OnProposed.
func (t *telemetry) OnProposed(shard uint64, forwarded bool, d time.Duration, err error) {
	path := "local"
	if forwarded {
		path = "forwarded"
	}
	t.propose.Record(context.Background(), d.Seconds(), metric.WithAttributes(
		attribute.String("path", path), shardAttribute(shard), attribute.Bool("error", err != nil)))
}

// OnSync is the Raft log's OnSync.
func (t *telemetry) OnSync(d time.Duration) {
	t.logSync.Record(context.Background(), d.Seconds())
}

// OnLeaderChange counts a leader change of shard.
func (t *telemetry) OnLeaderChange(shard uint64) {
	t.leaderChanges.Add(context.Background(), 1, metric.WithAttributes(shardAttribute(shard)))
}

// OnKeepAlive records the round trip of one keepalive.
func (t *telemetry) OnKeepAlive(shard uint64, start time.Time, err error) {
	t.keepAlive.Record(context.Background(), time.Since(start).Seconds(), metric.WithAttributes(
		shardAttribute(shard), attribute.Bool("error", err != nil)))
}

// OnRaftState records the commit index shard's local replica recorded
// when it started.
func (t *telemetry) OnRaftState(shard, commit uint64) { t.startCommits.Store(shard, commit) }

// StartCommit is the commit index shard's local replica recorded when it
// started, 0 if it recorded none (a new replica).
func (t *telemetry) StartCommit(shard uint64) uint64 {
	v, _ := t.startCommits.Load(shard)
	c, _ := v.(uint64)
	return c
}

// WriteRaftMetrics writes dragonboat's own Raft metrics in the Prometheus
// text format, when a peer of this process was started with
// Config.RaftMetrics (dragonboat keeps them process-wide, for every peer
// of the process together). Serve it next to an OpenTelemetry Prometheus
// exporter's /metrics, as examples/peer does.
func WriteRaftMetrics(w io.Writer) { vmetrics.WritePrometheus(w, false) }
