package router

import (
	"context"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/msgcheck"
	"github.com/lockmesh/lockmesh/internal/replica"
)

// ReadRequest asks a peer hosting a replica of Shard to answer Query
// linearizably (ServeRead). Like ProposeRequest it carries the newest
// feature level its sender speaks, which the serving peer checks.
type ReadRequest struct {
	Shard uint64        `msgpack:"s"`
	Query replica.Query `msgpack:"q"`
	Level level.Level   `msgpack:"v,omitempty"`
}

// Read answers q on shard linearizably: through this peer's replica
// (Host.ReadLocal, a ReadIndex round) or through a peer that hosts one
// (CallHost with ReadMethod).
func (r *Router) Read(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	if r.host.Hosts(shard) {
		return r.host.ReadLocal(ctx, shard, q)
	}
	body, err := msgpack.Marshal(ReadRequest{Shard: shard, Query: q, Level: r.host.TopLevel()})
	if err != nil {
		return replica.Answer{}, err
	}
	resp, err := r.CallHost(ctx, shard, r.cfg.ReadMethod, body)
	if err != nil {
		return replica.Answer{}, err
	}
	var a replica.Answer
	if err := msgcheck.Unmarshal(resp, &a, msgcheck.MaxBody); err != nil {
		return replica.Answer{}, fmt.Errorf("rpc body: %w", err)
	}
	return a, nil
}

// ReadRetrying is Read, tried again while the error is Retryable (no
// leader yet, the replica moved) until ctx ends; the error then says what
// the last try hit (Unavailable).
func (r *Router) ReadRetrying(ctx context.Context, shard uint64, q replica.Query) (replica.Answer, error) {
	for attempt := 0; ; attempt++ {
		a, err := r.Read(ctx, shard, q)
		if err == nil || !Retryable(err) {
			return a, err
		}
		if berr := r.Backoff(ctx, min(attempt, 3)); berr != nil {
			return a, r.Unavailable(shard, berr, err)
		}
	}
}

// ServeRead answers a ReadRequest another peer sent, through this peer's
// replica, within ProposalTimeout. It answers with code CodeNotHosted when
// this peer has no replica of the shard and CodeBusy when the caller may
// retry. The request's caller and level are checked before (node's
// handler).
func (r *Router) ServeRead(ctx context.Context, req ReadRequest) (replica.Answer, error) {
	if !r.host.Hosts(req.Shard) {
		return replica.Answer{}, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no replica of shard %d", r.cfg.Name, req.Shard)
	}
	ctx, cancel := context.WithTimeout(ctx, r.ProposalTimeout())
	defer cancel()
	a, err := r.host.ReadLocal(ctx, req.Shard, req.Query)
	if err != nil && Retryable(err) {
		return replica.Answer{}, lockerr.RPC(lockerr.CodeBusy, "shard %d: %v", req.Shard, err)
	}
	return a, err
}
