package node

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

// maxBodySize caps every RPC body and placement record this package decodes.
const maxBodySize = msgcheck.MaxBody

// RPC methods on lockmesh's transport. The bootstrap and membership
// methods (methodPrepare to methodMembership) are served and made by
// internal/membership's Service (see newMembership).
const (
	methodPropose        uint8 = iota + 1 // router.ProposeRequest -> router.ProposeResponse
	methodRead                            // router.ReadRequest -> replica.Answer
	methodKeepAlive                       // router.KeepAliveRequest -> router.KeepAliveResponse
	methodNotify                          // leader.Notice -> nothing
	methodPrepare                         // bootstrap phase one: encoded placement
	methodCommit                          // bootstrap phase two: encoded placement
	methodAbort                           // bootstrap abort: cluster id
	methodGetPlacement                    // membership.GetPlacementLinearizable or nothing -> encoded placement
	methodStatus                          // -> membership.PeerStatus
	methodConfigChange                    // membership.MembershipChange
	methodTransferLeader                  // membership.TransferRequest
	methodCaughtUp                        // membership.ShardRequest: answers once the local replica serves reads
	methodSetPlacement                    // encoded placement, proposed to the meta shard
	methodMembership                      // membership.ShardRequest -> membership.Membership: the shard's Raft membership
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
func (n *Node) checkSender(sender level.Level) error {
	if cl := n.clusterLevel(); max(sender, level.Positional) < cl {
		return rpcError(codeIncompatible, "%v: the caller speaks feature levels up to %d, but the cluster runs at level %d: upgrade it (see docs/UPGRADING.md)",
			ErrIncompatible, max(sender, level.Positional), cl)
	}
	return nil
}

// Requests that route by key (router.ProposeRequest and
// router.ReadRequest) carry the newest feature level their sender speaks
// (0 from releases before levels, which read as 1): a peer that does not
// speak the cluster's level may place keys by another rule, so its
// requests are refused (checkSender).

func encodeBody(v any) ([]byte, error) { return msgpack.Marshal(v) }

// decodeBody decodes an RPC body from a peer, which may be anyone who
// reaches the port: its shape is checked first, so that lengths it claims
// cannot make msgpack allocate more than a small multiple of its size.
func decodeBody(b []byte, v any) error {
	if err := msgcheck.Unmarshal(b, v, maxBodySize); err != nil {
		return fmt.Errorf("rpc body: %w", err)
	}
	return nil
}

// Bounds of the answers the handler makes, reserved by the transport
// before it runs (transport.Config.AnswerBound): a peer that pipelines
// requests and reads no answers holds at most MaxPendingBytes of them.
const (
	smallAnswer = 4 << 10  // an error, an acknowledgement, a request's state
	largeAnswer = 64 << 10 // a shard's Raft membership
)

// answerBound is the most bytes handle answers the request with: a
// method's fixed bound, a multiple of the request for proposals and
// keepalives (a result per command, an id per session), and a whole frame
// for what can list a shard's keys, every shard or the layout.
func answerBound(method uint8, body []byte) int {
	switch method {
	case methodPropose, methodKeepAlive:
		return 8*len(body) + smallAnswer
	case methodRead:
		var req router.ReadRequest
		if msgcheck.Unmarshal(body, &req, maxBodySize) == nil && req.Query.Kind == replica.QueryRequest {
			return smallAnswer
		}
		return maxBodySize
	case methodGetPlacement, methodStatus:
		return maxBodySize
	case methodMembership:
		return largeAnswer
	}
	return smallAnswer
}

// rpcError builds a transport error the caller can classify by code.
func rpcError(code uint16, format string, args ...any) error {
	return lockerr.RPC(code, format, args...)
}

// handle serves lockmesh's transport. Each call runs on its own goroutine.
func (n *Node) handle(ctx context.Context, method uint8, body []byte) ([]byte, error) {
	if n.isClosed() {
		return nil, rpcError(codeClosed, "peer %s is closing", n.cfg.Name)
	}
	caller := callerOf(ctx)
	switch method {
	case methodPrepare, methodCommit, methodAbort:
		// Founders that may not be members of anything yet: the plan
		// says who may call (membership.Service.ServeBootstrap).
		return n.membership.ServeBootstrap(ctx, method, body)
	}
	if err := n.checkKnown(caller); err != nil {
		return nil, err
	}
	switch method {
	case methodPropose:
		var req router.ProposeRequest
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		if err := n.checkSender(req.Level); err != nil {
			return nil, err
		}
		return n.router.ServePropose(ctx, req)
	case methodRead:
		var req router.ReadRequest
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		if err := n.checkSender(req.Level); err != nil {
			return nil, err
		}
		if req.Query.Kind == replica.QuerySessions && !n.authzOff() {
			// Every session's id and owner, for the leader's own lease
			// table: no peer asks another for it.
			return nil, rpcError(codeForbidden, "peer %s: %v: the session table is read only by the peer that hosts it", n.cfg.Name, authz.ErrForbidden)
		}
		a, err := n.router.ServeRead(ctx, req)
		if err != nil {
			return nil, err
		}
		return encodeBody(a)
	case methodKeepAlive:
		var req router.KeepAliveRequest
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		if !n.authzOff() {
			if err := authz.KeepAlive(caller, req.Sessions, n.shardSessions(req.Shard)); err != nil {
				return nil, n.refused(err)
			}
		}
		resp, err := n.leading.ServeKeepAlive(ctx, req)
		if err != nil {
			return nil, err
		}
		return encodeBody(resp)
	case methodNotify:
		var req leader.Notice
		if err := decodeBody(body, &req); err != nil {
			return nil, err
		}
		if p := n.placement.Load(); p != nil && !n.authzOff() {
			if err := authz.ShardHost(caller, req.Shard, p.HostNames(req.Shard), "grant notice"); err != nil {
				return nil, n.refused(err)
			}
		}
		n.leading.OnNotice(req)
		return nil, nil
	case methodGetPlacement:
		return n.membership.ServeBootstrap(ctx, method, body)
	case methodStatus, methodConfigChange, methodTransferLeader, methodCaughtUp, methodSetPlacement, methodMembership:
		return n.membership.Serve(ctx, method, body)
	}
	return nil, fmt.Errorf("unknown method %d", method)
}
