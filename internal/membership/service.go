package membership

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/bootstrap"
	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/internal/msgcheck"
	"github.com/lockmesh/lockmesh/internal/replicas"
	"github.com/lockmesh/lockmesh/internal/router"
	"github.com/lockmesh/lockmesh/mesh"
	"github.com/lockmesh/lockmesh/transport"
)

// Peer is what a Service needs of the peer it runs on that this package
// does not own: its RPCs, the caller of a request and the form of a
// refusal, the state machines behind the shards, the records and checks
// that go with a new layout, adopting the first one, and its goroutines.
// The running peer implements it. Its
// methods are called from the RPC handlers, the placement loop, the
// controller and Leave, several at once.
type Peer interface {
	// Call calls the named peer with method and body, or serves the call
	// here when name is this peer. It fails when gossip gives the name no
	// address.
	Call(ctx context.Context, name string, method uint8, body []byte) ([]byte, error)
	// Caller returns who sent the request ctx belongs to, as the port it
	// arrived on verified it (anonymous without TLS).
	Caller(ctx context.Context) authz.Caller
	// Refused turns an authorization refusal into the error its caller
	// gets: not retryable, naming the rule. Nil stays nil.
	Refused(err error) error
	// ReadIndex makes a linearizable read of shard through this peer's
	// replica: it returns nil once the replica has applied everything
	// committed before the read.
	ReadIndex(ctx context.Context, shard uint64) error
	// ProposeLayout commits an encoded layout through this peer's meta
	// replica and returns the epoch the meta shard holds after it: the
	// layout's own if the shard took it, 0 if it refused it (not derived
	// from the current layout). It fails with an error wrapping
	// lockerr.ReplicaHalted when the replica halted.
	ProposeLayout(ctx context.Context, raw []byte) (uint64, error)
	// CheckLevel refuses a layout whose feature level this peer does not
	// speak.
	CheckLevel(p *layout.Placement) error
	// SaveRecord records the layout in the data dir, durably.
	SaveRecord(p *layout.Placement) error
	// RefuseLayout records why this peer does not adopt a layout that lists
	// its name under another NodeHostID.
	RefuseLayout(ie *layout.IdentityError)
	// StartReplica starts this peer's replica r of shard, with the state
	// machine of the shard.
	StartReplica(p *layout.Placement, shard uint64, r layout.Replica) error
	// Adopt makes p, the layout bootstrap agreed on or fetched, this
	// peer's first: it records it, starts the replicas p places here,
	// opens lock calls and gossips the cluster id. It refuses (and
	// records why) a layout that lists this peer's name under another
	// NodeHostID. Called once, under the bootstrap lock.
	Adopt(p *layout.Placement) error
	// Go runs f on a goroutine the peer waits for at Close, with a
	// context that ends when the peer closes.
	Go(f func(ctx context.Context))
}

// Methods are the RPC method numbers a Service's requests travel under.
// The running peer owns the table of methods (internal/peer/rpc.go) and dispatches
// these to Serve, apart from Prepare, Commit, Abort and GetPlacement,
// which ServeBootstrap answers.
type Methods struct {
	Prepare        uint8 // bootstrap phase one: encoded plan
	Commit         uint8 // bootstrap phase two: encoded plan
	Abort          uint8 // bootstrap abort: cluster id
	GetPlacement   uint8 // GetPlacementLinearizable or nothing -> encoded layout
	Status         uint8 // -> PeerStatus
	ConfigChange   uint8 // MembershipChange
	TransferLeader uint8 // TransferRequest
	CaughtUp       uint8 // ShardRequest: answers once the local replica serves reads
	SetPlacement   uint8 // encoded layout, proposed to the meta shard
	Membership     uint8 // ShardRequest -> Membership: the shard's Raft membership
}

// GetPlacementLinearizable is the body of a Methods.GetPlacement call that
// wants the layout read linearizably from the meta shard or an error, never
// the answering peer's own copy. A call without it (a joining peer looking
// for the cluster) takes the copy.
var GetPlacementLinearizable = []byte{1}

// Config is what a Service is built from.
type Config struct {
	Name     string        // this peer's name in the layout
	Methods  Methods       // the RPC methods of its requests
	Interval time.Duration // between the placement loop's reads of the layout
	TopLevel level.Level   // the newest feature level this peer speaks
	// TLS is the RPC port's TLS config, with which Vouch checks a member's
	// certificate; nil without TLS.
	TLS *tls.Config
	// Dial connects to a peer's RPC address for Vouch; nil dials TCP.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// UnsafeNoAuthz switches authorization off: the broken variant the
	// hostile-peer tests must catch. Never set outside them.
	UnsafeNoAuthz bool
	Logger        *slog.Logger // nil discards
	// Applied returns the last applied index of each lock replica this
	// peer runs (PeerStatus.Applied); nil answers none.
	Applied func() map[uint64]uint64

	// Bootstrap: with BootstrapExpect founders (0: only join), lay out
	// Shards lock shards with ReplicationFactor replicas each; try every
	// BootstrapInterval; time promises by Now.
	BootstrapExpect   int
	Shards            int
	ReplicationFactor int
	BootstrapInterval time.Duration
	Now               func() time.Time

	Mesh     *mesh.Mesh      // gossip: the members the controller and bootstrap see
	Replicas *replicas.Table // the replicas this peer runs
	Router   *router.Router  // tries a shard's hosts; its leader cache, backoff and proposal timeout
	// Peers calls a peer at its RPC address (bootstrap calls founders
	// that may be in no layout yet).
	Peers router.Caller
	// Placement is this peer's copy of the layout, shared with node: the
	// placement loop replaces it with each newer layout it adopts.
	Placement *atomic.Pointer[layout.Placement]
	// Adopting is the layout this peer expects before Placement is set,
	// shared with node (its Raft transport's check of peers reads it):
	// the plan it promised, then the layout it is adopting.
	Adopting *atomic.Pointer[layout.Placement]
}

// Service is one peer's part in its cluster's membership: it forms a
// cluster with other founders or adopts a running one's layout
// (RunBootstrap, ServeBootstrap), answers the membership RPCs of the
// controller and of leaving peers (Serve), makes them (it is the
// controller's Cluster), keeps this peer's copy of the layout current and its
// replicas in line with it (RunPlacement), and moves the peer out of the
// cluster (Leave).
type Service struct {
	peer      Peer
	cfg       Config
	log       *slog.Logger
	mesh      *mesh.Mesh
	replicas  *replicas.Table
	nh        *dragonboat.NodeHost
	router    *router.Router
	placement *atomic.Pointer[layout.Placement]
	adopting  *atomic.Pointer[layout.Placement]

	bootMu sync.Mutex
	// promises is the bootstrap plan this peer agreed to, not yet
	// committed. Guarded by bootMu, with the check that placement is nil.
	promises bootstrap.Promises
}

// New returns the membership service of peer. It does
// nothing on its own until RunBootstrap and RunPlacement.
func New(peer Peer, cfg Config) *Service {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{
		peer:      peer,
		cfg:       cfg,
		log:       log,
		mesh:      cfg.Mesh,
		replicas:  cfg.Replicas,
		nh:        cfg.Replicas.NodeHost(),
		router:    cfg.Router,
		placement: cfg.Placement,
		adopting:  cfg.Adopting,
	}
}

// ShardRequest names the shard of a Methods.CaughtUp or
// Methods.Membership request. The other requests of the controller and of
// a leaving peer are MembershipChange and TransferRequest; the answers
// PeerStatus and Membership.
type ShardRequest struct {
	Shard uint64 `msgpack:"s"`
}

// TransferRequest asks a host of Shard to hand its leadership to replica
// Target.
type TransferRequest struct {
	Shard  uint64 `msgpack:"s"`
	Target uint64 `msgpack:"t"`
}

func encode(v any) ([]byte, error) { return msgpack.Marshal(v) }

// decode decodes an RPC body from a peer, which may be anyone who reaches
// the port: its shape is checked first, so that lengths it claims cannot
// make msgpack allocate more than a small multiple of its size.
func decode(b []byte, v any) error {
	if err := msgcheck.Unmarshal(b, v, msgcheck.MaxBody); err != nil {
		return fmt.Errorf("rpc body: %w", err)
	}
	return nil
}

// Busy turns a retryable error of shard into lockerr.CodeBusy, so that
// the calling peer retries; other errors and nil pass through.
func Busy(shard uint64, err error) error {
	if err != nil && router.Retryable(err) {
		return lockerr.RPC(lockerr.CodeBusy, "shard %d: %v", shard, err)
	}
	return err
}

// callWith encodes req and calls the peer named name with it.
func (s *Service) callWith(ctx context.Context, name string, method uint8, req any) ([]byte, error) {
	body, err := encode(req)
	if err != nil {
		return nil, err
	}
	return s.peer.Call(ctx, name, method, body)
}

// Serve answers the controller's and leaving peers' requests: the
// membership methods of Methods (Status to Membership; ServeBootstrap
// answers the others). Node has checked that the caller
// is a known peer; the rules for each method are applied here.
func (s *Service) Serve(ctx context.Context, method uint8, body []byte) ([]byte, error) {
	ms := s.cfg.Methods
	if p := s.placement.Load(); p != nil && !s.cfg.UnsafeNoAuthz && (method == ms.ConfigChange || method == ms.TransferLeader) {
		if err := authz.MetaMember(s.peer.Caller(ctx), p.HostNames(layout.MetaShard), "membership change"); err != nil {
			return nil, s.peer.Refused(err)
		}
	}
	switch method {
	case ms.Status:
		st := PeerStatus{Replicas: s.replicas.Running(), Leaders: map[uint64]uint64{}, Level: s.cfg.TopLevel}
		for shard, id := range st.Replicas {
			if lid, ok := s.replicas.Leader(shard); ok {
				st.Leaders[shard] = lid
				if lid == id {
					st.Leading = append(st.Leading, shard)
				}
			}
		}
		if s.cfg.Applied != nil && layout.LevelOf(s.placement.Load()).ReportsApplied() {
			st.Applied = s.cfg.Applied()
		}
		return encode(st)
	case ms.ConfigChange:
		var req MembershipChange
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout())
		defer cancel()
		// Idempotent: a change whose first try timed out may have been
		// applied, and the controller that asked may have lost the layout
		// write that follows it; asking again must succeed.
		m, err := s.localMembership(ctx, req.Shard)
		if err != nil {
			return nil, err
		}
		_, member := m.Nodes[req.Replica]
		if _, removed := m.Removed[req.Replica]; removed && req.Add {
			return nil, lockerr.RPC(lockerr.CodeRejected, "replica %d was removed from shard %d and cannot be added back", req.Replica, req.Shard)
		}
		switch {
		case req.Add && member, !req.Add && !member:
			return nil, nil
		case req.Add:
			err = s.nh.SyncRequestAddReplica(ctx, req.Shard, req.Replica, req.NodeHostID, 0)
		default:
			err = s.nh.SyncRequestDeleteReplica(ctx, req.Shard, req.Replica, 0)
		}
		return nil, Busy(req.Shard, err)
	case ms.Membership:
		var req ShardRequest
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout())
		defer cancel()
		m, err := s.localMembership(ctx, req.Shard)
		if err != nil {
			return nil, err
		}
		var resp Membership
		for id := range m.Nodes {
			resp.Members = append(resp.Members, id)
		}
		for id := range m.Removed {
			resp.Removed = append(resp.Removed, id)
		}
		return encode(resp)
	case ms.TransferLeader:
		var req TransferRequest
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		if !s.replicas.Hosts(req.Shard) {
			return nil, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no replica of shard %d", s.cfg.Name, req.Shard)
		}
		return nil, s.nh.RequestLeaderTransfer(req.Shard, req.Target)
	case ms.CaughtUp:
		var req ShardRequest
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		if !s.replicas.Hosts(req.Shard) {
			return nil, lockerr.RPC(lockerr.CodeNotHosted, "peer %s does not run shard %d yet", s.cfg.Name, req.Shard)
		}
		rctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout())
		defer cancel()
		// Any linearizable read will do (the meta shard answers every query
		// with the layout).
		if err := s.peer.ReadIndex(rctx, req.Shard); err != nil {
			return nil, lockerr.RPC(lockerr.CodeBusy, "shard %d not caught up: %v", req.Shard, err)
		}
		return nil, nil
	case ms.SetPlacement:
		if !s.replicas.Hosts(layout.MetaShard) {
			return nil, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no meta replica", s.cfg.Name)
		}
		q, err := layout.Decode(body)
		if err != nil {
			return nil, err
		}
		if err := s.authorizeLayout(ctx, q); err != nil {
			return nil, err
		}
		return nil, s.ProposePlacement(ctx, q)
	}
	return nil, fmt.Errorf("unknown membership method %d", method)
}

// authorizeLayout applies authz.LayoutChange to q, a layout a caller asks
// this meta host to write, against the layout the meta shard holds now
// (this peer's copy when the meta replica cannot answer).
func (s *Service) authorizeLayout(ctx context.Context, q *layout.Placement) error {
	c := s.peer.Caller(ctx)
	if c.Anonymous() || s.cfg.UnsafeNoAuthz {
		return nil
	}
	cur, err := s.ReadLocalPlacement(ctx)
	if err != nil {
		if cur = s.placement.Load(); cur == nil {
			return Busy(layout.MetaShard, err)
		}
	}
	return s.peer.Refused(authz.LayoutChange(c, cur, q))
}

// localMembership reads shard's Raft membership through this peer's
// replica, linearizably; a retryable failure is answered as CodeBusy.
func (s *Service) localMembership(ctx context.Context, shard uint64) (*dragonboat.Membership, error) {
	if !s.replicas.Hosts(shard) {
		return nil, lockerr.RPC(lockerr.CodeNotHosted, "peer %s hosts no replica of shard %d", s.cfg.Name, shard)
	}
	m, err := s.nh.SyncGetShardMembership(ctx, shard)
	return m, Busy(shard, err)
}

// The controller's Host, over the membership RPCs.

// LeadsMeta reports whether this peer's replica leads the meta shard.
func (s *Service) LeadsMeta() bool { return s.replicas.Leads(layout.MetaShard) }

// Members lists the gossip members, sorted by name.
func (s *Service) Members() []mesh.Member { return s.mesh.Members() }

// Member finds the gossip member of that name.
func (s *Service) Member(name string) (mesh.Member, bool) { return s.mesh.Member(name) }

// Backoff sleeps a jittered interval that grows with attempt (the
// router's); it fails when ctx ends or the router closes first.
func (s *Service) Backoff(ctx context.Context, attempt int) error {
	return s.router.Backoff(ctx, attempt)
}

// Status asks the named peer which replicas it runs and who leads their
// shards as it sees them.
func (s *Service) Status(ctx context.Context, peer string) (PeerStatus, error) {
	var st PeerStatus
	raw, err := s.peer.Call(ctx, peer, s.cfg.Methods.Status, nil)
	if err == nil {
		err = decode(raw, &st)
	}
	return st, err
}

// AskLeaders asks the hosts of the shards of p this peer has no replica
// of who leads them (one Status call per host, while ctx lasts), and keeps
// the answers as the router's leader hints. Without a replica the only
// other source is the leader named in the last answer to a call on the
// shard, which goes stale when the peer makes none (a departed leader was
// named for minutes).
func (s *Service) AskLeaders(ctx context.Context, p *layout.Placement) map[uint64]string {
	out := map[uint64]string{}
	asked := map[string]bool{}
	for _, shard := range p.ShardIDs() {
		if s.replicas.Hosts(shard) {
			continue
		}
		for _, host := range p.HostNames(shard) {
			if _, known := out[shard]; known || asked[host] || ctx.Err() != nil {
				continue
			}
			asked[host] = true
			st, err := s.Status(ctx, host)
			if err != nil {
				continue
			}
			for sh, id := range st.Leaders {
				if pe, ok := p.PeerByReplica(id); ok && p.Hosts(sh, pe.Name) && !s.replicas.Hosts(sh) {
					out[sh] = pe.Name
					s.router.SetLeader(sh, pe.Name)
				}
			}
		}
	}
	return out
}

// CaughtUp asks peer whether its replica of shard serves a linearizable
// read: it is a member and has applied everything committed before it.
func (s *Service) CaughtUp(ctx context.Context, peer string, shard uint64) error {
	_, err := s.callWith(ctx, peer, s.cfg.Methods.CaughtUp, ShardRequest{Shard: shard})
	return err
}

// TransferLeader asks the named peer to hand shard's leadership to replica
// target.
func (s *Service) TransferLeader(ctx context.Context, peer string, shard, target uint64) error {
	_, err := s.callWith(ctx, peer, s.cfg.Methods.TransferLeader, TransferRequest{Shard: shard, Target: target})
	return err
}

// ChangeMembership asks a host of the shard to change its Raft membership
// (see Host).
func (s *Service) ChangeMembership(ctx context.Context, c MembershipChange) error {
	err := s.configChange(ctx, c)
	if err != nil && lockerr.Code(err) == lockerr.CodeRejected {
		return fmt.Errorf("%w: %w", ErrReplicaRemoved, err)
	}
	return err
}

// configChange asks a host of the shard to change its Raft membership.
func (s *Service) configChange(ctx context.Context, req MembershipChange) error {
	p := s.placement.Load()
	body, err := encode(req)
	if err != nil {
		return err
	}
	return s.router.TryHosts(ctx, router.Tries{
		Shard:      req.Shard,
		Rounds:     20,
		MaxBackoff: 3,
		// The likely leader first, then every host of the newest layout
		// this peer knows.
		Hosts: func(int) []string {
			if q := s.placement.Load(); q != nil {
				p = q
			}
			hosts := p.HostNames(req.Shard)
			if l := s.router.LeaderGuess(req.Shard); l != "" {
				hosts = append([]string{l}, hosts...)
			}
			return hosts
		},
		Call: func(ctx context.Context, h string) error {
			_, err := s.peer.Call(ctx, h, s.cfg.Methods.ConfigChange, body)
			return err
		},
		// A host that refuses the change (a removed replica cannot come
		// back) speaks for the shard: no other host will accept it.
		Judge: func(_ string, err error) router.Step {
			if lockerr.Code(err) == lockerr.CodeRejected {
				return router.Stop
			}
			return router.NextHost
		},
		NoneTried: errors.New("no host"),
	})
}

// Membership reads shard's Raft membership from a peer hosting it.
func (s *Service) Membership(ctx context.Context, shard uint64) (Membership, error) {
	var m Membership
	body, err := encode(ShardRequest{Shard: shard})
	if err != nil {
		return m, err
	}
	raw, err := s.router.CallHost(ctx, shard, s.cfg.Methods.Membership, body)
	if err == nil {
		err = decode(raw, &m)
	}
	return m, err
}

// Vouch proves that the gossip member m is who it says (see Host): with
// TLS, the peer answering at m's RPC address must present a certificate
// of the cluster's CA that names m.Name. Without TLS there is nothing to
// prove it with beyond the gossip key, which memberlist already checked.
func (s *Service) Vouch(ctx context.Context, m mesh.Member) error {
	if s.cfg.TLS == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.router.ProposalTimeout())
	defer cancel()
	addr := m.Meta.RPCAddr
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("RPC address %q: %w", addr, err)
	}
	var conn net.Conn
	if s.cfg.Dial != nil {
		conn, err = s.cfg.Dial(ctx, addr)
	} else {
		conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return fmt.Errorf("dial %s: %w", addr, err)
	}
	defer conn.Close()
	cfg := s.cfg.TLS.Clone()
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
