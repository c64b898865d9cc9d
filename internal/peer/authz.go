package peer

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/mesh"
	"github.com/lockmesh/lockmesh/transport"
)

// Every request a peer serves is authorized here, where it is accepted,
// by the rules of internal/authz: the sender's own checks are never
// trusted. The caller is whoever the transport verified (its client
// certificate's names); without TLS it is anonymous, and only the rules
// that need no identity apply (docs/SECURITY.md).

// callerOf returns the verified caller of the request ctx belongs to.
func callerOf(ctx context.Context) authz.Caller {
	p, _ := transport.PeerFromContext(ctx)
	return authz.Caller{Names: p.Names}
}

// refused turns an authorization refusal into the error its caller gets:
// not retryable, naming the rule.
func (n *Peer) refused(err error) error {
	if err == nil {
		return nil
	}
	return RPCError(codeForbidden, "peer %s: %v", n.cfg.Name, err)
}

// authzOff reports whether a test switched authorization off (the broken
// variant the hostile-peer suite must catch).
func (n *Peer) authzOff() bool { return n.hooks.UnsafeNoAuthz }

// checkKnown applies authz.Known: with identity, the caller must be a
// member of the layout or of the gossip mesh.
func (n *Peer) checkKnown(c authz.Caller) error {
	if n.authzOff() || c.Anonymous() {
		return nil // nothing to check, and every request passes here
	}
	var v authz.View
	if p := n.placement.Load(); p != nil {
		for _, pe := range p.Peers {
			v.Peers = append(v.Peers, pe.Name)
		}
	}
	v.Gossip = func(name string) bool {
		m, ok := n.mesh.Member(name)
		return ok && m.State == mesh.StateAlive
	}
	return n.refused(authz.Known(c, v))
}

// Authorize is the router's check of a forwarded proposal.
func (h routerHost) Authorize(ctx context.Context, shard uint64, cmds []lockfsm.Command) error {
	n := h.n
	if n.authzOff() {
		return nil
	}
	// handle has applied checkKnown to every request before it reaches
	// ServePropose: what is left are the command rules. The commands join
	// an entry this peer writes, which marks their OpenSessions Capped
	// from the level that caps sessions (level.CapsSessions): they need not come
	// marked.
	if err := n.fitsLevel(cmds); err != nil {
		// This peer's view of the level may lag a raise the caller has
		// seen: the caller may retry, and is served once it has.
		return lockerr.RPC(lockerr.CodeBusy, "peer %s: %v", n.cfg.Name, err)
	}
	s := replica.Sessions{Shard: shard, Read: n.nh.StaleRead}
	return n.refused(authz.Commands(callerOf(ctx), cmds, s))
}

// fitsLevel refuses commands that use what the cluster's feature level,
// as this peer knows it, does not have yet: a replica of an older
// release would halt on them.
func (n *Peer) fitsLevel(cmds []lockfsm.Command) error {
	l := n.ClusterLevel()
	if l >= level.Max {
		return nil
	}
	for i := range cmds {
		if need := level.Level(cmds[i].FeatureLevel()); need > l {
			return fmt.Errorf("%w: %s uses feature level %d; the cluster is at level %d, which not every replica may read", authz.ErrForbidden, cmds[i].Op, need, l)
		}
	}
	return nil
}

// ShardSessions is the local replica's view of shard's sessions, read
// without a Raft round (replica.Sessions), for commands that reach the
// shard as they were written (proposed over the Raft port): from
// the level that caps sessions on, their OpenSessions must be marked Capped, as every peer
// at that level marks them, or they would escape the session caps.
func (n *Peer) ShardSessions(shard uint64) authz.Sessions {
	return replica.Sessions{Shard: shard, Read: n.nh.StaleRead, RequireCapped: n.ClusterLevel().CapsSessions()}
}

// knownConn is the RPC server's transport.Config.Known, asked once a
// connection's TLS handshake is done: one whose verified certificate
// names a peer the layout lists is a member's, and may use the
// connections reserved for members, which strangers cannot fill. An
// address proves nothing (127.0.0.1 is every local process), so the
// transport never asks without TLS, and nothing here goes by one.
func (n *Peer) knownConn(_ net.Addr, st *tls.ConnectionState) bool {
	if st == nil || len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		return false
	}
	return listsAny(n.placement.Load(), transport.CertNames(st.PeerCertificates[0]))
}

// raftMember is the Raft transport's check of a peer's certificate, on
// both ends of a connection: one of its names must be a peer the layout
// lists. A certificate of the cluster's CA for anyone else carries no
// Raft message (a peer being admitted is listed before it is given
// replicas; until this peer's copy of the layout lists it, its
// connections are refused and dragonboat redials).
func (n *Peer) raftMember(names []string) bool {
	if n.authzOff() {
		return true
	}
	return listsAny(n.expectedLayout(), names)
}

// listsAny reports whether layout p (nil: none yet) lists a peer by one
// of names, the names a verified certificate carries.
func listsAny(p *layout.Placement, names []string) bool {
	if p == nil {
		return false
	}
	for _, name := range names {
		if _, ok := p.Peer(name); ok {
			return true
		}
	}
	return false
}

// layoutOwner is gossip's mesh.Config.Bound: the layout binds each member
// name to one NodeHostID, and Raft messages for that NodeHostID go only to
// the member of that name, whatever another member gossips.
func (n *Peer) layoutOwner(nodeHostID string) (string, bool) {
	p := n.expectedLayout()
	if p == nil {
		return "", false
	}
	for _, pe := range p.Peers {
		if pe.NodeHostID == nodeHostID {
			return pe.Name, true
		}
	}
	return "", false
}

// expectedLayout is the layout the Raft side goes by: this peer's, or
// before it has one, the layout it is adopting or the plan it promised
// (its replicas and the founders' talk before placement is set).
func (n *Peer) expectedLayout() *layout.Placement {
	if p := n.placement.Load(); p != nil {
		return p
	}
	return n.adopting.Load()
}
