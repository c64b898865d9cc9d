package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/cluster"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
	"github.com/lockmesh/lockmesh/transport"
)

// newController builds the layout controller (internal/cluster), acting
// through this peer's RPCs; start runs it.
func (n *Node) newController() *cluster.Controller {
	return cluster.NewController(controllerHost{n}, cluster.ControllerConfig{
		Interval:        n.controlInterval(),
		RTT:             n.cfg.RTT,
		ProposalTimeout: n.proposalTimeout(),
		DeadAfter:       n.cfg.DeadAfter,
		TopLevel:        n.topLevel(),
		Now:             n.now,
		Logger:          n.log,
	})
}

func (n *Node) controlInterval() time.Duration { return max(5*n.cfg.RTT, 100*time.Millisecond) }

// leadsShard reports whether this peer's replica of shard is its leader.
func (n *Node) leadsShard(shard uint64) bool { return n.replicas.Leads(shard) }

// controllerHost is what the controller reaches of its peer: the meta
// shard, gossip and the membership RPCs of the other peers.
type controllerHost struct{ n *Node }

func (h controllerHost) LeadsMeta() bool { return h.n.leadsShard(metaShardID) }

func (h controllerHost) ReadPlacement(ctx context.Context) (*layout.Placement, error) {
	return h.n.readMetaPlacement(ctx)
}

func (h controllerHost) ProposePlacement(ctx context.Context, q *layout.Placement) error {
	return h.n.proposePlacement(ctx, q)
}

func (h controllerHost) Members() []mesh.Member { return h.n.mesh.Members() }

func (h controllerHost) Member(name string) (mesh.Member, bool) { return h.n.mesh.Member(name) }

func (h controllerHost) Status(ctx context.Context, peer string) (cluster.PeerStatus, error) {
	st, err := h.n.peerStatus(ctx, peer)
	return cluster.PeerStatus{Replicas: st.Replicas, Leaders: st.Leaders, Leading: st.Leading, Level: st.Level}, err
}

func (h controllerHost) CaughtUp(ctx context.Context, peer string, shard uint64) error {
	return h.n.caughtUp(ctx, peer, shard)
}

func (h controllerHost) ChangeMembership(ctx context.Context, c cluster.MembershipChange) error {
	err := h.n.configChange(ctx, configChangeReq{Shard: c.Shard, Add: c.Add, Replica: c.Replica, NodeHostID: c.NodeHostID})
	if err != nil && errCode(err) == codeRejected {
		return fmt.Errorf("%w: %w", cluster.ErrReplicaRemoved, err)
	}
	return err
}

func (h controllerHost) Membership(ctx context.Context, shard uint64) (cluster.Membership, error) {
	m, err := h.n.membership(ctx, shard)
	return cluster.Membership{Members: m.Members, Removed: m.Removed}, err
}

func (h controllerHost) TransferLeader(ctx context.Context, peer string, shard, target uint64) error {
	_, err := h.n.callPeerWith(ctx, peer, methodTransferLeader, transferReq{Shard: shard, Target: target})
	return err
}

func (h controllerHost) Backoff(ctx context.Context, attempt int) error {
	return h.n.backoff(ctx, attempt)
}

// peerStatus asks the named peer which replicas it runs and who leads
// their shards as it sees them.
func (n *Node) peerStatus(ctx context.Context, name string) (statusResp, error) {
	var st statusResp
	raw, err := n.callPeerName(ctx, name, methodStatus, nil)
	if err == nil {
		err = decodeBody(raw, &st)
	}
	return st, err
}

// caughtUp asks peer whether its replica of shard serves a linearizable
// read: it is a member and has applied everything committed before it.
func (n *Node) caughtUp(ctx context.Context, peer string, shard uint64) error {
	_, err := n.callPeerWith(ctx, peer, methodCaughtUp, shardReq{Shard: shard})
	return err
}

// Vouch proves that the gossip member m is who it says (see
// cluster.Host): with TLS, the peer answering at m's RPC address must
// present a certificate of the cluster's CA that names m.Name. Without
// TLS there is nothing to prove it with beyond the gossip key, which
// memberlist already checked.
func (h controllerHost) Vouch(ctx context.Context, m mesh.Member) error {
	n := h.n
	if n.cfg.TLS == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.proposalTimeout())
	defer cancel()
	addr := m.Meta.RPCAddr
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("RPC address %q: %w", addr, err)
	}
	var conn net.Conn
	if n.hooks.rpcDial != nil {
		conn, err = n.hooks.rpcDial(ctx, addr)
	} else {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	cfg := n.cfg.TLS.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = host
	}
	cfg.VerifyConnection = func(st tls.ConnectionState) error {
		if len(st.PeerCertificates) == 0 {
			return errors.New("no certificate")
		}
		if names := transport.CertNames(st.PeerCertificates[0]); !slices.Contains(names, m.Name) {
			return fmt.Errorf("the certificate at %s names %q, not %q", addr, names, m.Name)
		}
		return nil
	}
	if err := tls.Client(conn, cfg).HandshakeContext(ctx); err != nil {
		return fmt.Errorf("TLS handshake with %s at %s: %w", m.Name, addr, err)
	}
	return nil
}
