package peer

import (
	"context"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/leader"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/msgcheck"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/internal/router"
)

// MaxBodySize caps every RPC body and placement record this package decodes.
const MaxBodySize = msgcheck.MaxBody

// RPC methods on lockmesh's transport. The bootstrap and membership
// methods (MethodPrepare to MethodMembership) are served and made by
// internal/membership's Service (see newMembership).
const (
	MethodPropose        uint8 = iota + 1 // router.ProposeRequest -> router.ProposeResponse
	MethodRead                            // router.ReadRequest -> replica.Answer
	MethodKeepAlive                       // router.KeepAliveRequest -> router.KeepAliveResponse
	MethodNotify                          // leader.Notice -> nothing
	MethodPrepare                         // bootstrap phase one: encoded placement
	MethodCommit                          // bootstrap phase two: encoded placement
	MethodAbort                           // bootstrap abort: cluster id
	MethodGetPlacement                    // membership.GetPlacementLinearizable or nothing -> encoded placement
	MethodStatus                          // -> membership.PeerStatus
	MethodConfigChange                    // membership.MembershipChange
	MethodTransferLeader                  // membership.TransferRequest
	MethodCaughtUp                        // membership.ShardRequest: answers once the local replica serves reads
	MethodSetPlacement                    // encoded placement, proposed to the meta shard
	MethodMembership                      // membership.ShardRequest -> membership.Membership: the shard's Raft membership
	MethodWatch                           // WatchRequest -> WatchAnswer (feature level 4)
)

// Application error codes carried in transport.Error (see internal/lockerr).
const (
	codeBusy         = lockerr.CodeBusy
	codeClosed       = lockerr.CodeClosed
	codeIncompatible = lockerr.CodeIncompatible
	codeForbidden    = lockerr.CodeForbidden
)

// checkSender refuses a request from a peer whose newest feature level,
// as the request says, is below the cluster's.
func (n *Peer) checkSender(sender level.Level) error {
	if cl := n.ClusterLevel(); max(sender, level.Positional) < cl {
		return RPCError(codeIncompatible, "%v: the caller speaks feature levels up to %d, but the cluster runs at level %d: upgrade it (see docs/UPGRADING.md)",
			lockerr.Incompatible, max(sender, level.Positional), cl)
	}
	return nil
}

// Requests that route by key (router.ProposeRequest and
// router.ReadRequest) carry the newest feature level their sender speaks
// (0 from releases before levels, which read as 1): a peer that does not
// speak the cluster's level may place keys by another rule, so its
// requests are refused (checkSender).

func EncodeBody(v any) ([]byte, error) { return msgpack.Marshal(v) }

// DecodeBody decodes an RPC body from a peer, which may be anyone who
// reaches the port: its shape is checked first, so that lengths it claims
// cannot make msgpack allocate more than a small multiple of its size.
func DecodeBody(b []byte, v any) error {
	if err := msgcheck.Unmarshal(b, v, MaxBodySize); err != nil {
		return fmt.Errorf("rpc body: %w", err)
	}
	return nil
}

// Bounds of the answers the handler makes, reserved by the transport
// before it runs (transport.Config.AnswerBound): a peer that pipelines
// requests and reads no answers holds at most MaxPendingBytes of them.
const (
	SmallAnswer = 4 << 10  // an error, an acknowledgement, a request's state
	LargeAnswer = 64 << 10 // a shard's Raft membership
)

// AnswerBound is the most bytes handle answers the request with: a
// method's fixed bound, a multiple of the request for proposals and
// keepalives (a result per command, an id per session), and a whole frame
// for what can list a shard's keys, every shard or the layout.
func AnswerBound(method uint8, body []byte) int {
	switch method {
	case MethodPropose, MethodKeepAlive:
		return 8*len(body) + SmallAnswer
	case MethodRead:
		var req router.ReadRequest
		if msgcheck.Unmarshal(body, &req, MaxBodySize) == nil && req.Query.Kind == replica.QueryRequest {
			return SmallAnswer
		}
		return MaxBodySize
	case MethodWatch:
		// A request that may wait holds a LargeAnswer's room; a snapshot,
		// answered at once, a frame's (see watch.go).
		var req WatchRequest
		if msgcheck.Unmarshal(body, &req, MaxBodySize) == nil && !req.Snapshot {
			return LargeAnswer
		}
		return MaxBodySize
	case MethodGetPlacement, MethodStatus:
		return MaxBodySize
	case MethodMembership:
		return LargeAnswer
	}
	return SmallAnswer
}

// RPCError builds a transport error the caller can classify by code.
func RPCError(code uint16, format string, args ...any) error {
	return lockerr.RPC(code, format, args...)
}

// handle serves lockmesh's transport. Each call runs on its own goroutine.
func (n *Peer) handle(ctx context.Context, method uint8, body []byte) ([]byte, error) {
	if n.IsClosed() {
		return nil, RPCError(codeClosed, "peer %s is closing", n.cfg.Name)
	}
	caller := callerOf(ctx)
	switch method {
	case MethodPrepare, MethodCommit, MethodAbort:
		// Founders that may not be members of anything yet: the plan
		// says who may call (membership.Service.ServeBootstrap).
		return n.membership.ServeBootstrap(ctx, method, body)
	}
	if err := n.checkKnown(caller); err != nil {
		return nil, err
	}
	switch method {
	case MethodPropose:
		var req router.ProposeRequest
		if err := DecodeBody(body, &req); err != nil {
			return nil, err
		}
		if err := n.checkSender(req.Level); err != nil {
			return nil, err
		}
		return n.router.ServePropose(ctx, req)
	case MethodRead:
		var req router.ReadRequest
		if err := DecodeBody(body, &req); err != nil {
			return nil, err
		}
		if err := n.checkSender(req.Level); err != nil {
			return nil, err
		}
		if req.Query.Kind == replica.QuerySessions && !n.authzOff() {
			// Every session's id and owner, for the leader's own lease
			// table: no peer asks another for it.
			return nil, RPCError(codeForbidden, "peer %s: %v: the session table is read only by the peer that hosts it", n.cfg.Name, authz.ErrForbidden)
		}
		a, err := n.router.ServeRead(ctx, req)
		if err != nil {
			return nil, err
		}
		return EncodeBody(a)
	case MethodKeepAlive:
		var req router.KeepAliveRequest
		if err := DecodeBody(body, &req); err != nil {
			return nil, err
		}
		if !n.authzOff() {
			if err := authz.KeepAlive(caller, req.Sessions, n.ShardSessions(req.Shard)); err != nil {
				return nil, n.refused(err)
			}
		}
		resp, err := n.leading.ServeKeepAlive(ctx, req)
		if err != nil {
			return nil, err
		}
		return EncodeBody(resp)
	case MethodNotify:
		var req leader.Notice
		if err := DecodeBody(body, &req); err != nil {
			return nil, err
		}
		if p := n.placement.Load(); p != nil && !n.authzOff() {
			if err := authz.ShardHost(caller, req.Shard, p.HostNames(req.Shard), "grant notice"); err != nil {
				return nil, n.refused(err)
			}
		}
		n.leading.OnNotice(req)
		return nil, nil
	case MethodWatch:
		var req WatchRequest
		if err := DecodeBody(body, &req); err != nil {
			return nil, err
		}
		if err := n.checkSender(req.Level); err != nil {
			return nil, err
		}
		a, err := n.ServeWatch(ctx, req)
		if err != nil {
			if router.Retryable(err) {
				return nil, RPCError(lockerr.CodeBusy, "shard %d: %v", req.Shard, err)
			}
			return nil, err
		}
		return EncodeBody(a)
	case MethodGetPlacement:
		return n.membership.ServeBootstrap(ctx, method, body)
	case MethodStatus, MethodConfigChange, MethodTransferLeader, MethodCaughtUp, MethodSetPlacement, MethodMembership:
		return n.membership.Serve(ctx, method, body)
	}
	return nil, fmt.Errorf("unknown method %d", method)
}
