package bootstrap

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/mesh"
)

// Forming a cluster.
//
// With BootstrapExpect N, peers gossip until they see N alive peers that
// belong to no cluster; then the first of them by name coordinates a
// two-phase agreement over a plan that lays out the shards over the N
// founders. The rules, each pure code here (Service runs the loop and the
// RPCs, forming.go):
//
//  1. Formation ([Decide]). Only members that are alive and gossip a
//     NodeHostID and an RPC address count. A peer that sees another member
//     already in a cluster adopts that cluster's layout from it (the first
//     such member by name) and forms nothing. Otherwise the founders are
//     the first N free members by name, where join-only and NoReplicas
//     members are never free: counted, one could be picked to coordinate
//     and would not. The first founder coordinates; everyone else waits.
//  2. Phase one, prepare ([Promises.Prepare]): each founder promises the
//     plan, and refuses any plan of another cluster id for [PromiseTTL]
//     after its last promise. A promise that lapses (its coordinator died
//     between the phases) may be replaced by another plan. Only a founder
//     promises, and only a plan whose coordinator it sees in gossip as
//     free to found a cluster ([MayFound]; authz.BootstrapPrepare): a
//     joiner promises nothing.
//  3. An abort from the plan's coordinator ([Promises.Abort]) withdraws
//     the promise of that cluster id, and only that one.
//  4. Phase two, commit: a founder adopts a plan received over the network
//     only if it is, byte for byte, the plan it promised
//     ([Promises.Promised] and authz.BootstrapCommit). Lapsing does not
//     withdraw a promise: a late commit of the promised plan is still
//     adopted unless another plan replaced it.
//
// Two coordinators that raced (N+1 peers starting at once with different
// views) lay out overlapping sets of founders, and a founder promises only
// one of them (rule 2), so they cannot both get every promise: no two
// clusters form from one peer.

// PromiseTTL bounds how long a peer holds a promise for a plan that was
// neither committed nor aborted (its coordinator died between phases).
const PromiseTTL = 10 * time.Second

// Formation is what a peer that belongs to no cluster does next.
type Formation struct {
	// AdoptFrom, when set, is a member already in a cluster: ask it for the
	// layout and adopt it.
	AdoptFrom *mesh.Member
	// Founders, when set, are the peers to form a cluster with, this peer
	// first: it coordinates.
	Founders []mesh.Member
	// With neither set, the peer waits: too few free members yet, or
	// another founder coordinates.
}

// Decide applies rule 1: given the gossip members, this peer's name and
// BootstrapExpect (0 for a peer that only joins), it says whether to adopt
// a running cluster's layout, to coordinate the founding of one, or to
// wait. It does not modify members.
func Decide(members []mesh.Member, self string, expect int) Formation {
	members = slices.Clone(members)
	slices.SortStableFunc(members, func(a, b mesh.Member) int { return cmp.Compare(a.Name, b.Name) })
	var free []mesh.Member
	for _, m := range members {
		if m.State != mesh.StateAlive || m.Meta.NodeHostID == "" || m.Meta.RPCAddr == "" {
			continue
		}
		if m.Meta.Cluster != 0 && m.Name != self {
			return Formation{AdoptFrom: &m}
		}
		if !m.Meta.NoReplicas && !m.Meta.JoinOnly {
			free = append(free, m)
		}
	}
	if expect <= 0 || len(free) < expect {
		return Formation{}
	}
	free = free[:expect]
	if free[0].Name != self {
		return Formation{}
	}
	return Formation{Founders: free}
}

// MayFound reports whether gossip shows m as a member free to found a
// cluster as rule 1 counts it: alive, gossiping a NodeHostID and an RPC
// address, in no cluster, neither join-only nor NoReplicas.
func MayFound(m mesh.Member) bool {
	return m.State == mesh.StateAlive && m.Meta.NodeHostID != "" && m.Meta.RPCAddr != "" &&
		m.Meta.Cluster == 0 && !m.Meta.JoinOnly && !m.Meta.NoReplicas
}

// NewPlan is the layout a coordinator proposes for cluster id over the
// founders: shards shards of rf replicas, at the newest feature level
// every founder and this peer (top) speak, with that level's key scheme.
func NewPlan(id uint64, shards, rf int, top level.Level, founders []mesh.Member) *layout.Placement {
	peers := make([]layout.Peer, len(founders))
	for i, m := range founders {
		peers[i] = layout.Peer{Name: m.Name, NodeHostID: m.Meta.NodeHostID}
	}
	l := NewLevel(top, founders)
	p := layout.New(id, shards, rf, layout.KeySchemeFor(l), peers)
	p.Level = uint32(l)
	return p
}

// ErrPromised is Prepare's refusal: this peer holds an unlapsed promise
// for a plan of another cluster id.
var ErrPromised = errors.New("promised another plan")

// Promises is one peer's phase-one state (rules 2 to 4): the plan it
// promised, if any, and until when that promise refuses other plans. It
// does no I/O and reads no clock: the caller passes the time.
//
// It is not safe for concurrent use: the caller serialises it with its own
// layout (a peer in a cluster promises nothing and adopts once), under one
// lock.
type Promises struct {
	plan *layout.Placement
	raw  []byte
	due  time.Time
}

// Prepare promises plan, raw as it was received, at time now (rule 2). It
// returns ErrPromised while an earlier promise for another cluster id has
// not lapsed; a promise of the same cluster id is renewed.
func (ps *Promises) Prepare(plan *layout.Placement, raw []byte, now time.Time) error {
	if ps.plan != nil && ps.plan.ClusterID != plan.ClusterID && now.Before(ps.due) {
		return ErrPromised
	}
	ps.plan, ps.raw, ps.due = plan, raw, now.Add(PromiseTTL)
	return nil
}

// PromiseFor returns the plan promised for cluster id, or nil: what an
// Abort of id would withdraw (rule 3).
func (ps *Promises) PromiseFor(id uint64) *layout.Placement {
	if ps.plan != nil && ps.plan.ClusterID == id {
		return ps.plan
	}
	return nil
}

// Abort withdraws the promise if it is for cluster id (rule 3), and
// reports whether it did.
func (ps *Promises) Abort(id uint64) bool {
	if ps.PromiseFor(id) == nil {
		return false
	}
	ps.Settle()
	return true
}

// Promised returns the promised plan as it was received, lapsed or not,
// or nil: a commit is adopted only if it is these bytes (rule 4).
func (ps *Promises) Promised() []byte { return ps.raw }

// Settle ends the promise: this peer adopted a layout.
func (ps *Promises) Settle() { ps.plan, ps.raw, ps.due = nil, nil, time.Time{} }
