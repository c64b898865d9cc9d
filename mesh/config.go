package mesh

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
)

const (
	// DefaultBindAddr is the gossip address used when Config.BindAddr is
	// empty: all interfaces, memberlist's usual port.
	DefaultBindAddr = "0.0.0.0:7946"

	// DefaultBroadcastTimeout is used when Config.BroadcastTimeout is zero.
	DefaultBroadcastTimeout = 5 * time.Second
)

// Config configures a [Mesh]. Zero values mean defaults.
type Config struct {
	// Name is the peer's unique name in the mesh. Required.
	Name string
	// BindAddr is the host:port gossip listens on (TCP and UDP); port 0
	// picks a free port, see [Mesh.Addr]. Empty means [DefaultBindAddr].
	BindAddr string
	// AdvertiseAddr is the IP:port other peers should use to reach this
	// one, when it differs from BindAddr (NAT, 0.0.0.0). Optional.
	AdvertiseAddr string
	// SecretKey, when set, encrypts all gossip with AES-GCM (16, 24 or 32
	// bytes select AES-128, -192 or -256) and rejects unencrypted traffic in
	// both directions, so peers without the same key cannot join.
	SecretKey []byte
	// Meta is the initial metadata this peer gossips; see [Mesh.SetMeta].
	Meta Meta
	// Local selects memberlist's loopback timings (DefaultLocalConfig) for
	// tests and single-host setups; false selects DefaultLANConfig.
	Local bool
	// Logger receives the mesh's and memberlist's logs. Nil discards them.
	Logger *slog.Logger
	// OnEvent, when set, is called for every membership change, in the
	// order memberlist reported them, from one goroutine owned by the Mesh.
	// Events are queued without bound so memberlist never waits on it; a
	// slow OnEvent only delays later events (a growing backlog is logged).
	// OnEvent may call Members, Member and SetMeta, but must not call Close
	// or Leave: Close waits for OnEvent to return. No event is delivered
	// after Close returns.
	OnEvent func(Event)
	// BroadcastTimeout bounds how long SetMeta waits for the update to be
	// gossiped. Zero means [DefaultBroadcastTimeout].
	BroadcastTimeout time.Duration
	// MaxMembers is the most members a peer's state exchange may list
	// (default [DefaultMaxMembers]). memberlist allocates 112 bytes per
	// member a push-pull header announces before reading any of them; the
	// Mesh refuses headers above MaxMembers, and passes the others on only
	// once the stream carries at least 8 bytes per announced member. The
	// mesh cannot grow beyond it: raise it before a mesh nears it.
	MaxMembers int
	// ReclaimAfter is how long the NodeHostID of a member that died or
	// left stays reserved for that member's name. Within it the name may
	// come back (a restart, or a death declared by mistake or by a forged
	// message, which the member refutes within seconds) and still hold
	// its NodeHostID; after it, another live member gossiping the same
	// NodeHostID takes it over. Zero means [DefaultReclaimAfter]. While a
	// member holds a NodeHostID no other member can: see [Mesh.Conflicts].
	ReclaimAfter time.Duration
	// Bound, when set, tells which member name a NodeHostID belongs to by
	// a record gossip cannot forge (lockmesh's cluster layout binds each
	// name to one NodeHostID): the Registry then resolves a bound
	// NodeHostID only to that member, whoever gossip says holds it, so an
	// impostor cannot take over a NodeHostID whose owner is gone or that
	// it announced first. It must not block; it is called on dragonboat's
	// goroutines. Nil, or ok false, leaves the gossip rules alone.
	Bound func(nodeHostID string) (name string, ok bool)
	// Transport, when set, carries all gossip instead of the UDP/TCP
	// transport the Mesh would bind to BindAddr. It is a test hook for
	// fault injection (internal/faultnet wraps a memberlist.NetTransport to
	// cut gossip links); production code leaves it nil. It should listen
	// on BindAddr; the address other peers are told to use comes from its
	// FinalAdvertiseAddr unless AdvertiseAddr is set. The Mesh takes it
	// over: Close shuts it down, and so does Create when it fails. Like
	// the default transport, it sits behind the Mesh's gossip guard, which
	// refuses messages that would make memberlist allocate far more than
	// they carry.
	Transport memberlist.NodeAwareTransport
}

// DefaultConfig returns a Config with every default filled in except Name.
func DefaultConfig() Config {
	return Config{
		BindAddr:         DefaultBindAddr,
		BroadcastTimeout: DefaultBroadcastTimeout,
		MaxMembers:       DefaultMaxMembers,
		ReclaimAfter:     DefaultReclaimAfter,
	}
}

// Validate reports the first problem with c, wrapping [ErrInvalidConfig].
func (c Config) Validate() error {
	if c.Name == "" {
		return fmt.Errorf("%w: Name is required (a unique peer name)", ErrInvalidConfig)
	}
	if c.BindAddr != "" {
		host, _, err := splitHostPort(c.BindAddr)
		if err != nil {
			return fmt.Errorf("%w: BindAddr %q: %v", ErrInvalidConfig, c.BindAddr, err)
		}
		if host != "" && net.ParseIP(host) == nil {
			return fmt.Errorf("%w: BindAddr %q: host must be an IP address (or empty for all interfaces)", ErrInvalidConfig, c.BindAddr)
		}
	}
	if c.AdvertiseAddr != "" {
		host, _, err := splitHostPort(c.AdvertiseAddr)
		if err != nil {
			return fmt.Errorf("%w: AdvertiseAddr %q: %v", ErrInvalidConfig, c.AdvertiseAddr, err)
		}
		if net.ParseIP(host) == nil {
			return fmt.Errorf("%w: AdvertiseAddr %q: host must be an IP address", ErrInvalidConfig, c.AdvertiseAddr)
		}
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		return fmt.Errorf("%w: SecretKey is %d bytes, want 16, 24 or 32", ErrInvalidConfig, len(c.SecretKey))
	}
	if _, err := EncodeMeta(c.Meta); err != nil {
		return fmt.Errorf("%w: Meta: %w", ErrInvalidConfig, err)
	}
	if c.MaxMembers < 0 || c.MaxMembers > maxMaxMembers {
		return fmt.Errorf("%w: MaxMembers %d outside [0, %d]; use 0 for the default of %d", ErrInvalidConfig, c.MaxMembers, maxMaxMembers, DefaultMaxMembers)
	}
	if c.BroadcastTimeout < 0 {
		return fmt.Errorf("%w: BroadcastTimeout %v is negative", ErrInvalidConfig, c.BroadcastTimeout)
	}
	if c.ReclaimAfter < 0 {
		return fmt.Errorf("%w: ReclaimAfter %v is negative; use 0 for the default of %v", ErrInvalidConfig, c.ReclaimAfter, DefaultReclaimAfter)
	}
	return nil
}

// splitHostPort splits a host:port with a numeric port in [0, 65535].
func splitHostPort(addr string) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q is not a number in 0-65535", portStr)
	}
	return host, int(port), nil
}
