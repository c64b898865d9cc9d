// Package router carries lockmesh's commands to the shards that apply
// them. It batches the commands this peer sends to a shard into as few
// Raft entries as the load allows, proposes each batch on the local
// replica or hands it to the shard leader's peer, sends a command whose
// outcome is unknown again unchanged, and remembers which peer leads each
// shard.
//
// Proposing is asynchronous, as dragonboat's NodeHost.Propose is:
// Propose queues a command and returns a RequestState whose ResultC
// delivers its one outcome, with no goroutine parked per request. Apply
// is the synchronous call, a short loop over Propose that retries what
// Retryable allows until its context ends.
package router

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/vmihailenco/msgpack/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/msgcheck"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/transport"
)

// Caller sends one request to a peer's RPC address and returns the
// answer; *transport.Client is one.
type Caller interface {
	Call(ctx context.Context, addr string, method uint8, body []byte) ([]byte, error)
}

// Host is what the router needs from the peer it runs on. Its methods are
// called from many goroutines and must not call back into the router.
type Host interface {
	// Placement returns the cluster layout this peer knows, or nil before
	// it knows one.
	Placement() *layout.Placement
	// Hosts reports whether this peer runs a replica of shard.
	Hosts(shard uint64) bool
	// LocalLeader returns the replica that this peer's replica of shard
	// believes leads it.
	LocalLeader(shard uint64) (replicaID uint64, ok bool)
	// Addr resolves a peer name to its RPC address, if it is reachable.
	Addr(name string) (string, bool)
	// ProposeLocal commits one encoded batch through this peer's replica
	// of shard and returns its results (dragonboat forwards the proposal
	// to the leader if it is elsewhere).
	ProposeLocal(ctx context.Context, shard uint64, data []byte) ([]lockfsm.Result, error)
	// TopLevel is the newest feature level this peer speaks; forwarded
	// proposals and reads carry it, and hosts refuse callers below the
	// cluster's. What the router writes follows the cluster's level, the
	// one Placement records (layout.LevelOf).
	TopLevel() level.Level
	// Authorize decides whether the caller of a forwarded proposal (ctx
	// carries it, see transport.PeerFromContext) may propose cmds on
	// shard; ServePropose refuses the whole proposal with its error.
	Authorize(ctx context.Context, shard uint64, cmds []lockfsm.Command) error
	// ReadLocal answers q linearizably through this peer's replica of
	// shard (a ReadIndex round), bounded by ctx and ProposalTimeout.
	ReadLocal(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error)
	// ServeKeepAlive serves a keepalive this peer sends to itself, as its
	// KeepAliveMethod handler would: it leads the shard, or answers with
	// its guess of who does.
	ServeKeepAlive(ctx context.Context, req KeepAliveRequest) (KeepAliveResponse, error)
}

// Config is what the router is told at start.
type Config struct {
	// Name is this peer's name in the layout.
	Name string
	// RTT is the network round trip; it scales timeouts and backoff.
	RTT time.Duration
	// Peers sends requests to other peers.
	Peers Caller
	// ProposeMethod is the RPC method a peer serves with ServePropose.
	ProposeMethod uint8
	// KeepAliveMethod is the RPC method a peer serves keepalives on
	// (KeepAliveRequest -> KeepAliveResponse).
	KeepAliveMethod uint8
	// ReadMethod is the RPC method a peer serves with ServeRead
	// (ReadRequest -> replica.Answer).
	ReadMethod uint8

	// Tracer, when not nil, traces the proposals of commands proposed
	// from a sampled span (see trace.go).
	Tracer trace.Tracer
	// OnProposed, when not nil, is told of each batch proposed from this
	// peer: its shard, whether it was forwarded to another peer, how long
	// it took and how it ended. It must not block.
	OnProposed func(shard uint64, forwarded bool, d time.Duration, err error)
}

// ProposeRequest is a batch forwarded to a peer hosting the shard, which
// proposes it there (ServePropose). It carries the newest feature level
// its sender speaks (0 from releases before levels, which read as 1).
type ProposeRequest struct {
	Shard uint64      `msgpack:"s"`
	Cmds  []byte      `msgpack:"c"` // lockfsm.EncodeCommandsFormat
	Level level.Level `msgpack:"v,omitempty"`
	// Traces are the trace contexts of the batch's traced commands;
	// written from the level that carries them (level.CarriesTraces).
	Traces []TraceRef `msgpack:"t,omitempty"`
}

// ProposeResponse answers a ProposeRequest.
type ProposeResponse struct {
	Results []byte `msgpack:"r"` // lockfsm.EncodeResults
	Leader  string `msgpack:"l"` // the shard leader as the serving peer sees it
}

// Outcome is what became of one proposed command: its result, or why its
// outcome is unknown or it was refused. For a group (ProposeGroup),
// Results holds every command's result in order and Result the first's.
type Outcome struct {
	Result  lockfsm.Result
	Results []lockfsm.Result
	Err     error
}

// RequestState is a proposed command, or group of commands, on its way:
// ResultC delivers its Outcome exactly once. A group's commands stay
// together, in order, in one entry.
type RequestState struct {
	cmds  []lockfsm.Command
	c     chan Outcome      // buffered 1: the batch never waits for a reader
	trace trace.SpanContext // of the caller, when sampled
}

// ResultC returns the channel the command's Outcome arrives on.
func (rs *RequestState) ResultC() <-chan Outcome { return rs.c }

func (rs *RequestState) finish(o Outcome) { rs.c <- o }

// Router routes this peer's commands to their shards. Create it with New
// and stop it with Close. It is safe for concurrent use.
type Router struct {
	cfg  Config
	host Host

	ctx    context.Context // ended by Close
	cancel context.CancelFunc
	stop   chan struct{} // closed by Close
	wg     sync.WaitGroup

	batchMu  sync.Mutex
	batchers map[batcherKey]*batcher
	closed   bool

	leaderMu sync.Mutex
	leaders  map[uint64]string // shard -> name of the last known leader
}

// New returns a router for the peer host.
func New(cfg Config, host Host) *Router {
	r := &Router{
		cfg: cfg, host: host, stop: make(chan struct{}),
		batchers: map[batcherKey]*batcher{}, leaders: map[uint64]string{},
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r
}

// Close fails the commands still queued with lockerr.Closed, ends the
// batches in flight and waits for the router's goroutines. Later calls
// return lockerr.Closed. Close is idempotent.
func (r *Router) Close() {
	r.batchMu.Lock()
	if r.closed {
		r.batchMu.Unlock()
		return
	}
	r.closed = true
	r.batchMu.Unlock()
	close(r.stop)
	r.cancel()
	r.wg.Wait()
}

func (r *Router) isClosed() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// ProposalTimeout bounds one try of a proposal or read. A proposal that
// Raft dropped (a leader change or transfer) is only known lost when this
// runs out, so it is kept short: the retry is idempotent.
func (r *Router) ProposalTimeout() time.Duration { return max(10*r.cfg.RTT, 500*time.Millisecond) }

// Propose queues cmd for shard and returns its RequestState. It blocks
// only while the shard's queue is full, until ctx ends; it fails with
// ctx's error or lockerr.Closed, and then nothing was sent. The outcome
// arrives on the RequestState: an error there that Retryable accepts
// leaves the outcome unknown, and the same command may be proposed again
// (the state machine answers a repeat of a (session, request id) from its
// dedup state, so a retry never grants twice).
func (r *Router) Propose(ctx context.Context, shard uint64, cmd lockfsm.Command) (*RequestState, error) {
	// On the leader's peer, commands join those forwarded by other peers
	// in the local batcher: one entry for all of them.
	// A leader's own commands (LeaderTerm, ExpireSession) always go
	// through its own replica: hosts refuse them from the network, and
	// the term they carry decides whether they apply.
	return r.propose1(ctx, shard, []lockfsm.Command{cmd})
}

// ProposeGroup is Propose for commands that must share one entry, in
// order: an all-or-nothing group of Acquires (lockfsm.Command.Group). At
// most lockfsm.MaxGroup commands.
func (r *Router) ProposeGroup(ctx context.Context, shard uint64, cmds []lockfsm.Command) (*RequestState, error) {
	if len(cmds) == 0 || len(cmds) > lockfsm.MaxGroup {
		return nil, fmt.Errorf("a group of %d commands; 1 to %d fit in one entry", len(cmds), lockfsm.MaxGroup)
	}
	return r.propose1(ctx, shard, cmds)
}

func (r *Router) propose1(ctx context.Context, shard uint64, cmds []lockfsm.Command) (*RequestState, error) {
	local := r.host.Hosts(shard) && (r.LeaderGuess(shard) == r.cfg.Name || leaderOnly(cmds[0].Op))
	b, err := r.batcherFor(shard, local)
	if err != nil {
		return nil, err
	}
	return b.enqueue(ctx, cmds)
}

// leaderOnly reports whether op is proposed only by a shard's leader on
// its own replica, never forwarded (internal/authz refuses it from the
// network).
func leaderOnly(op lockfsm.Op) bool {
	return op == lockfsm.OpLeaderTerm || op == lockfsm.OpExpireSession || op == lockfsm.OpExpireHold
}

// Apply runs cmd on shard and returns its result: Propose, retried with
// backoff while the error is Retryable, until ctx ends. It then fails
// with an error wrapping lockerr.Unavailable, ctx's error and the last
// error seen; after Close it fails with lockerr.Closed.
func (r *Router) Apply(ctx context.Context, shard uint64, cmd lockfsm.Command) (lockfsm.Result, error) {
	rs, err := r.apply(ctx, shard, []lockfsm.Command{cmd})
	if err != nil {
		return lockfsm.Result{}, err
	}
	return rs[0], nil
}

// ApplyGroup is Apply for commands that must share one entry, in order
// (ProposeGroup); it returns their results.
func (r *Router) ApplyGroup(ctx context.Context, shard uint64, cmds []lockfsm.Command) ([]lockfsm.Result, error) {
	if len(cmds) == 0 || len(cmds) > lockfsm.MaxGroup {
		return nil, fmt.Errorf("a group of %d commands; 1 to %d fit in one entry", len(cmds), lockfsm.MaxGroup)
	}
	return r.apply(ctx, shard, cmds)
}

func (r *Router) apply(ctx context.Context, shard uint64, cmds []lockfsm.Command) ([]lockfsm.Result, error) {
	var lastErr error
	for attempt := 0; ; attempt++ {
		rs, err := r.propose1(ctx, shard, cmds)
		if err != nil {
			return nil, r.Unavailable(shard, err, lastErr)
		}
		select {
		case o := <-rs.ResultC():
			if o.Err == nil {
				return o.Results, nil
			}
			if !Retryable(o.Err) {
				return nil, fmt.Errorf("shard %d: %w", shard, o.Err)
			}
			lastErr = o.Err
		case <-ctx.Done():
			return nil, r.Unavailable(shard, ctx.Err(), lastErr)
		case <-r.stop:
			return nil, lockerr.Closed
		}
		if err := r.Backoff(ctx, attempt); err != nil {
			return nil, r.Unavailable(shard, err, lastErr)
		}
	}
}

// Unavailable is the error for a call on shard that gave up when ctx
// ended (ctxErr) after lastErr: lockerr.Closed once the router closed,
// ctxErr alone when nothing was tried, else both wrapped with
// lockerr.Unavailable.
func (r *Router) Unavailable(shard uint64, ctxErr, lastErr error) error {
	if r.isClosed() || errors.Is(ctxErr, lockerr.Closed) {
		return lockerr.Closed
	}
	if lastErr == nil {
		return ctxErr
	}
	return fmt.Errorf("%w: shard %d: %w (last error: %v)", lockerr.Unavailable, shard, ctxErr, lastErr)
}

// Backoff sleeps a jittered interval that grows with attempt, before a
// retry. It returns ctx's error if ctx ends first and lockerr.Closed if
// the router closes.
func (r *Router) Backoff(ctx context.Context, attempt int) error {
	d := r.cfg.RTT << min(attempt, 5)
	d = d/2 + rand.N(d/2+1)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.stop:
		return lockerr.Closed
	}
}

// Retryable reports whether an error leaves the outcome unknown or says
// "not now": the same command may be sent again.
func Retryable(err error) bool {
	switch {
	case errors.Is(err, dragonboat.ErrTimeout), errors.Is(err, dragonboat.ErrShardNotReady),
		errors.Is(err, dragonboat.ErrSystemBusy), errors.Is(err, dragonboat.ErrShardNotFound),
		errors.Is(err, dragonboat.ErrShardNotInitialized), errors.Is(err, dragonboat.ErrAborted),
		// The local replica closed under the call: it moved to another
		// peer (rebalancing, Leave), and another host will answer.
		errors.Is(err, dragonboat.ErrShardClosed),
		errors.Is(err, dragonboat.ErrCanceled),
		// The try's deadline passed before dragonboat took the request
		// (a forward to a dying leader used it up before the local
		// fallback): nothing was proposed, and the next try has its own.
		errors.Is(err, dragonboat.ErrInvalidDeadline),
		// Less than one Raft tick was left of the try's deadline:
		// dragonboat refused it before proposing anything. The next try
		// has its own deadline; if the caller's ctx has less than a tick
		// left, the retries end with the caller's deadline error.
		errors.Is(err, dragonboat.ErrTimeoutTooSmall),
		errors.Is(err, context.DeadlineExceeded), errors.Is(err, transport.ErrUnavailable),
		errors.Is(err, lockerr.NotReady),
		// The local replica fail-stopped; it is being stopped, and the
		// retry goes to a replica that applied the entry.
		errors.Is(err, lockerr.ReplicaHalted):
		return true
	}
	switch lockerr.Code(err) {
	case lockerr.CodeNotHosted, lockerr.CodeBusy, lockerr.CodeClosed, lockerr.CodeNoCluster:
		return true
	}
	return false
}

// ServePropose proposes a batch forwarded by another peer on this peer's
// replica and returns the encoded ProposeResponse. Forwarded commands
// join this peer's own in the local batcher, so the leader writes one
// entry for the commands of every peer. It answers with code
// CodeNotHosted when this peer has no replica of the shard and CodeBusy
// when the caller may retry.
func (r *Router) ServePropose(ctx context.Context, req ProposeRequest) ([]byte, error) {
	if !r.host.Hosts(req.Shard) {
		return nil, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no replica of shard %d", r.cfg.Name, req.Shard)
	}
	if len(req.Cmds) > lockfsm.MaxEntrySize {
		return nil, fmt.Errorf("proposal of %d bytes exceeds %d", len(req.Cmds), lockfsm.MaxEntrySize)
	}
	cmds, err := lockfsm.DecodeCommands(req.Cmds)
	if err != nil {
		return nil, err
	}
	if err := r.host.Authorize(ctx, req.Shard, cmds); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.ProposalTimeout())
	defer cancel()
	busy := func(err error) error { return lockerr.RPC(lockerr.CodeBusy, "shard %d: %v", req.Shard, err) }
	b, err := r.batcherFor(req.Shard, true)
	if err != nil {
		return nil, busy(err)
	}
	// Each command joins the batch on its own, but a group's stay
	// together (lockfsm.Units), as the proposer sent them.
	units := lockfsm.Units(cmds)
	states := make([]*RequestState, len(units))
	traces := remoteTraces(req.Traces, len(cmds))
	first := 0
	for i, u := range units {
		uctx := ctx
		if sc, ok := traces[first]; ok {
			var span trace.Span
			uctx, span = r.tracer().Start(trace.ContextWithRemoteSpanContext(ctx, sc), "lockmesh.serve_propose",
				trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attribute.Int64("lockmesh.shard", int64(req.Shard))))
			defer span.End()
		}
		first += len(u)
		if states[i], err = b.enqueue(uctx, u); err != nil {
			return nil, busy(err)
		}
	}
	results := make([]lockfsm.Result, 0, len(cmds))
	for _, rs := range states {
		select {
		case o := <-rs.ResultC():
			if o.Err != nil {
				if Retryable(o.Err) {
					return nil, busy(o.Err)
				}
				return nil, o.Err
			}
			results = append(results, o.Results...)
		case <-ctx.Done():
			return nil, busy(ctx.Err())
		}
	}
	data, err := lockfsm.EncodeResults(results)
	if err != nil {
		return nil, err
	}
	return msgpack.Marshal(ProposeResponse{Results: data, Leader: r.LeaderGuess(req.Shard)})
}

// propose commits an encoded batch on shard, through the local replica if
// this peer hosts one, or through a peer that does.
//
// A proposal made on a follower replica reaches the leader through
// dragonboat, but the follower learns of the commit only with the leader's
// next message, which costs up to a heartbeat. Handing the batch to the
// leader's peer and proposing it there is about twice as fast, so that is
// tried first.
func (r *Router) propose(ctx context.Context, shard uint64, data []byte, batch []*RequestState) (results []lockfsm.Result, err error) {
	hosted := r.host.Hosts(shard)
	leader := r.LeaderGuess(shard)
	if hosted && (leader == "" || leader == r.cfg.Name) {
		return r.proposeLocal(ctx, shard, data, batch)
	}
	start := time.Now()
	spans := r.startSpans(shard, batch, "lockmesh.forward", trace.SpanKindClient)
	defer func() {
		spans.end(err)
		r.observe(shard, true, start, err)
	}()
	req := ProposeRequest{Shard: shard, Cmds: data, Level: r.host.TopLevel()}
	if r.clusterLevel().CarriesTraces() {
		req.Traces = spans.traceRefs()
	}
	body, err := msgpack.Marshal(req)
	if err != nil {
		return nil, err
	}
	var raw []byte
	if hosted {
		addr, ok := r.host.Addr(leader)
		if !ok {
			return r.proposeLocal(ctx, shard, data, batch)
		}
		if raw, err = r.cfg.Peers.Call(ctx, addr, r.cfg.ProposeMethod, body); err != nil {
			if ctx.Err() != nil || !Retryable(err) {
				return nil, err
			}
			// The leader moved or is unreachable; the retry is
			// idempotent, and dragonboat finds the leader itself.
			return r.proposeLocal(ctx, shard, data, batch)
		}
	} else if raw, err = r.CallHost(ctx, shard, r.cfg.ProposeMethod, body); err != nil {
		return nil, err
	}
	var resp ProposeResponse
	if err := msgcheck.Unmarshal(raw, &resp, msgcheck.MaxBody); err != nil {
		return nil, fmt.Errorf("propose answer from shard %d: %w", shard, err)
	}
	if resp.Leader != "" {
		r.SetLeader(shard, resp.Leader)
	}
	return lockfsm.DecodeResults(resp.Results)
}

// proposeLocal commits an encoded batch through this peer's replica of
// shard, traced and timed.
func (r *Router) proposeLocal(ctx context.Context, shard uint64, data []byte, batch []*RequestState) (results []lockfsm.Result, err error) {
	start := time.Now()
	spans := r.startSpans(shard, batch, "lockmesh.propose", trace.SpanKindInternal)
	results, err = r.host.ProposeLocal(ctx, shard, data)
	spans.end(err)
	r.observe(shard, false, start, err)
	return results, err
}

// clusterLevel is the feature level of the layout this peer holds: what
// it writes at. A layout may lag, never lead, the cluster's level.
func (r *Router) clusterLevel() level.Level { return layout.LevelOf(r.host.Placement()) }
