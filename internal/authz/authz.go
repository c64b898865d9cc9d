// Package authz decides who may do what to a lockmesh peer over the
// network. Every rule is applied where a request is accepted (the RPC
// handler of the peer that serves it), never trusted from the sender, and
// every rule is a pure function of the caller and what the accepting peer
// knows, tested without a cluster.
//
// A caller is the set of names its verified TLS client certificate
// carries (transport.Peer). Without TLS a caller is anonymous: on an
// all-loopback deployment every local process is trusted with what needs
// an identity to refuse (docs/SECURITY.md says so), and only the rules
// that need none apply to it.
//
// The rules:
//
//  1. Leader-only commands never come from the network: ExpireSession,
//     ExpireHold and LeaderTerm are proposed by a shard's leader on its own replica. One
//     forwarded by anyone, a member included, is refused (a LeaderTerm
//     with a huge term would freeze a shard's expiries for ever).
//  2. A session's TTL is at most MaxSessionTTL, and a shard holds at most
//     MaxSessions sessions, MaxSessionsPerOwner of them per owner: no
//     caller holds a key for ever or fills the table. The state machine
//     enforces the session caps when it applies an OpenSession marked
//     Capped (lockfsm.Command.Capped), which every peer marks from feature
//     level 3 on: that is the guarantee, deterministic and immune to
//     proposals accepted at once. Here, where a command is accepted, the
//     caps are checked against the counts the replica last applied, only
//     to refuse a flood before it reaches Raft; and from level 3 on an
//     OpenSession proposed as written (over the Raft port) must carry the
//     mark, or it would escape the caps.
//  3. With identity, a caller must be a known peer (a member of the
//     layout, or of the gossip mesh, which a key guards) for anything but
//     bootstrap; a certificate of the cluster's CA for another name gets
//     nothing.
//  4. With identity, session commands (open, acquire, release, cancel,
//     close, keepalive) act only on sessions the caller owns: a session's
//     owner is the member Name that opened it, and its certificate must
//     carry that name.
//  5. With identity, Raft membership changes, leader transfers and layout
//     writes come only from members that host the meta shard (the
//     controller runs on its leader), except that a member may mark
//     itself draining (Leave).
//  6. Grant notices come only from members hosting the shard.
//  7. Bootstrap: only a founder (BootstrapExpect above 0) promises a
//     plan, and only a plan whose coordinator gossip shows as a member
//     free to found a cluster; with identity the prepare must come from
//     that coordinator. A commit is adopted only for the plan this peer
//     promised (with or without identity), and with identity, commit and
//     abort come only from a founder the plan lists. A joiner promises
//     nothing, so it adopts no commit: it takes its layout only by asking
//     a member.
package authz

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// ErrForbidden is wrapped by every refusal.
var ErrForbidden = errors.New("lockmesh: forbidden")

// Server-side limits (rule 2). They are the same on every peer of a
// release, so a command one accepts another would too.
const (
	// MaxSessionTTL is the longest session TTL a peer accepts.
	MaxSessionTTL = time.Hour
	// MaxSessions is the most sessions a shard accepts opening: the state
	// machine's cap, which it enforces on apply.
	MaxSessions = lockfsm.MaxSessions
	// MaxSessionsPerOwner is the most sessions one owner may have open on
	// a shard: the state machine's cap, which it enforces on apply.
	MaxSessionsPerOwner = lockfsm.MaxSessionsPerOwner
)

// Caller is who sent a request.
type Caller struct {
	// Names are the names the caller's verified certificate carries; nil
	// for an anonymous caller (no TLS).
	Names []string
}

// Anonymous reports whether the caller proved no identity.
func (c Caller) Anonymous() bool { return len(c.Names) == 0 }

// Is reports whether the caller's certificate names name.
func (c Caller) Is(name string) bool {
	for _, n := range c.Names {
		if n == name && n != "" {
			return true
		}
	}
	return false
}

// IsAny reports whether the caller's certificate names one of names, and
// which.
func (c Caller) IsAny(names []string) (string, bool) {
	for _, n := range names {
		if c.Is(n) {
			return n, true
		}
	}
	return "", false
}

func (c Caller) String() string {
	if c.Anonymous() {
		return "anonymous caller"
	}
	return fmt.Sprintf("caller %q", c.Names[0])
}

func forbidden(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrForbidden, fmt.Sprintf(format, args...))
}

// View is what the accepting peer knows when it decides.
type View struct {
	// Peers are the member names the peer's layout lists.
	Peers []string
	// Gossip reports whether name is an alive member of the gossip mesh.
	// Nil means none is.
	Gossip func(name string) bool
}

// Known applies rule 3: with identity, the caller must be a layout peer or
// an alive gossip member.
func Known(c Caller, v View) error {
	if c.Anonymous() {
		return nil
	}
	if _, ok := c.IsAny(v.Peers); ok {
		return nil
	}
	if v.Gossip != nil {
		for _, n := range c.Names {
			if v.Gossip(n) {
				return nil
			}
		}
	}
	return forbidden("%s is no member of this mesh", c)
}

// Sessions is the accepting replica's view of a shard's sessions. A
// session's owner never changes once it is open, so a replica that knows
// the session knows its owner for good.
type Sessions interface {
	// Owner returns the owner of session id, if the replica knows it.
	Owner(id uint64) (owner string, ok bool)
	// Count returns how many sessions are open, and how many of them
	// owner has, as the replica last applied. It costs O(1).
	Count(owner string) (total, owned int)
	// Capped reports whether an OpenSession must carry
	// lockfsm.Command.Capped to be accepted: the cluster runs at a
	// feature level whose writers all mark them, and the commands are
	// proposed as written (an entry that arrived over the Raft port),
	// so one without the mark was made to escape the caps.
	Capped() bool
}

// Commands applies rules 1, 2 and 4 to commands proposed over the network
// on one shard. It returns the first refusal.
func Commands(c Caller, cmds []lockfsm.Command, s Sessions) error {
	// Sessions the replica holds and these commands open, in all and by
	// owner, read once per owner. An early refusal only: proposals
	// accepted meanwhile may commit before these, which is why the state
	// machine enforces the caps.
	total, owned := 0, map[string]int{}
	for i := range cmds {
		cmd := &cmds[i]
		switch cmd.Op {
		case lockfsm.OpExpireSession, lockfsm.OpLeaderTerm, lockfsm.OpExpireHold:
			return forbidden("%s is proposed only by the shard's leader on its own replica, never over the network", cmd.Op)
		case lockfsm.OpOpenSession:
			if ttl := time.Duration(cmd.TTLMillis) * time.Millisecond; cmd.TTLMillis > uint64(MaxSessionTTL/time.Millisecond) {
				return forbidden("OpenSession: TTL %v is above the limit of %v", ttl, MaxSessionTTL)
			}
			if !c.Anonymous() && !c.Is(cmd.Owner) {
				return forbidden("OpenSession: %s may open sessions only for itself, not for owner %q", c, cmd.Owner)
			}
			if !cmd.Capped && s.Capped() {
				return forbidden("OpenSession: not marked Capped, as every peer at the cluster's feature level marks it, so the session caps would not apply to it")
			}
			n, ok := owned[cmd.Owner]
			if !ok {
				var all int
				all, n = s.Count(cmd.Owner)
				total = max(total, all)
			}
			if total >= MaxSessions {
				return forbidden("OpenSession: the shard holds %d sessions, counting those the proposal opens before it; the limit is %d", total, MaxSessions)
			}
			if n >= MaxSessionsPerOwner {
				return forbidden("OpenSession: owner %q holds %d sessions on the shard, counting those the proposal opens before it; the limit is %d", cmd.Owner, n, MaxSessionsPerOwner)
			}
			owned[cmd.Owner] = n + 1
			total++
		default:
			if c.Anonymous() {
				continue
			}
			if owner, ok := s.Owner(cmd.Session); ok && !c.Is(owner) {
				return forbidden("%s: session %d belongs to %q, not to %s", cmd.Op, cmd.Session, owner, c)
			}
		}
	}
	return nil
}

// KeepAlive applies rule 4 to a keepalive: every session it names that the
// replica knows must be the caller's.
func KeepAlive(c Caller, sessions []uint64, s Sessions) error {
	if c.Anonymous() {
		return nil
	}
	for _, id := range sessions {
		if owner, ok := s.Owner(id); ok && !c.Is(owner) {
			return forbidden("keepalive: session %d belongs to %q, not to %s", id, owner, c)
		}
	}
	return nil
}

// MetaMember applies rule 5: with identity, the caller must host the meta
// shard. metaHosts are the member names the layout places meta replicas
// on.
func MetaMember(c Caller, metaHosts []string, what string) error {
	if c.Anonymous() {
		return nil
	}
	if _, ok := c.IsAny(metaHosts); ok {
		return nil
	}
	return forbidden("%s: only a member hosting the meta shard may do this, not %s", what, c)
}

// ShardHost applies rule 6: with identity, the caller must host shard
// (hosts are the member names the layout places its replicas on).
func ShardHost(c Caller, shard uint64, hosts []string, what string) error {
	if c.Anonymous() {
		return nil
	}
	if _, ok := c.IsAny(hosts); ok {
		return nil
	}
	return forbidden("%s for shard %d: %s hosts no replica of it", what, shard, c)
}

// LayoutChange applies rule 5 to a layout write: with identity, the caller
// hosts the meta shard in cur, or next is cur with only the caller's own
// peer entry marked draining (a member leaving: Node.Leave).
func LayoutChange(c Caller, cur, next *layout.Placement) error {
	if c.Anonymous() {
		return nil
	}
	if _, ok := c.IsAny(cur.HostNames(layout.MetaShard)); ok {
		return nil
	}
	if name, ok := marksDraining(cur, next); ok && c.Is(name) {
		return nil
	}
	return forbidden("layout change: only a member hosting the meta shard may write the layout, or a member mark itself draining, not %s", c)
}

// marksDraining reports whether next is cur's successor with exactly one
// peer's Draining flag set and nothing else changed, and names that peer.
func marksDraining(cur, next *layout.Placement) (string, bool) {
	if next.Epoch != cur.Epoch+1 || len(next.Peers) != len(cur.Peers) {
		return "", false
	}
	want := cur.Clone()
	want.Epoch = next.Epoch
	name := ""
	for i, pe := range next.Peers {
		old := cur.Peers[i]
		if pe.Name != old.Name || pe.NodeHostID != old.NodeHostID {
			return "", false
		}
		if pe.Draining != old.Draining {
			if name != "" || !pe.Draining {
				return "", false
			}
			name = pe.Name
			want.Peers[i].Draining = true
		}
	}
	if name == "" || !reflect.DeepEqual(want, next) {
		return "", false
	}
	return name, true
}

// BootstrapPrepare applies rule 7 to a prepare (phase one), with or
// without identity. founder says this peer founds clusters (its
// BootstrapExpect is above 0): a joiner refuses every prepare, or whoever
// reaches its port could make it promise, and then commit, a plan of
// theirs. The plan's coordinator is its founder first by name (the one
// bootstrap.Decide lets coordinate); free reports whether gossip shows a
// peer as an alive member free to found a cluster, with the NodeHostID
// the plan gives it. With identity the caller must be the coordinator.
func BootstrapPrepare(c Caller, founder bool, plan *layout.Placement, free func(layout.Peer) bool) error {
	if !founder {
		return forbidden("bootstrap prepare: this peer founds no cluster (BootstrapExpect 0); it joins one by asking a member")
	}
	if len(plan.Peers) == 0 {
		return forbidden("bootstrap prepare: the plan lists no founder")
	}
	coord := slices.MinFunc(plan.Peers, func(a, b layout.Peer) int { return cmp.Compare(a.Name, b.Name) })
	if !c.Anonymous() && !c.Is(coord.Name) {
		return forbidden("bootstrap prepare: only the plan's coordinator %q may send it, not %s", coord.Name, c)
	}
	if free == nil || !free(coord) {
		return forbidden("bootstrap prepare: gossip shows the plan's coordinator %q as no alive member free to found a cluster", coord.Name)
	}
	return nil
}

// BootstrapCall applies rule 7's identity part to a commit or abort: with
// identity, the caller is a founder the plan lists.
func BootstrapCall(c Caller, plan *layout.Placement, what string) error {
	if c.Anonymous() {
		return nil
	}
	for _, pe := range plan.Peers {
		if c.Is(pe.Name) {
			return nil
		}
	}
	return forbidden("bootstrap %s: %s is not one of the founders the plan lists", what, c)
}

// BootstrapCommit applies rule 7's identity-free part: a commit received
// over the network is adopted only when it is the plan this peer promised
// in phase one (byte for byte). A joiner, which promised nothing, adopts a
// layout only by asking a member for it.
func BootstrapCommit(promised []byte, plan []byte) error {
	if promised == nil {
		return forbidden("bootstrap commit: this peer promised no plan")
	}
	if !bytes.Equal(promised, plan) {
		return forbidden("bootstrap commit: the plan is not the one this peer promised")
	}
	return nil
}
