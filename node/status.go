package node

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/internal/release"
	"github.com/lockmesh/lockmesh/internal/replica"
)

// Status is one peer's view of the mesh and of the cluster's shards, for
// operators: what the status page (Handler) shows. It is assembled from
// what this peer knows and what the peers it asks answer; it is not a
// linearizable read.
type Status struct {
	// Peer is this peer's name and Release its build's release.
	Peer, Release string
	// Cluster is the cluster's id, 0 before this peer knows one.
	Cluster uint64
	// Level is the cluster's feature level (docs/UPGRADING.md).
	Level uint8
	// Ready is true when the peer knows the layout and a leader of every
	// lock shard, as the replicas that answered know them: a Lock of any
	// key can be granted now. A shard without a quorum has no leader, so
	// Ready is false in an outage.
	Ready bool
	// Members are the peers gossip sees and those the layout lists, as
	// Members returns them, with the feature levels they speak.
	Members []MemberStatus
	// Shards are the cluster's lock shards, by id.
	Shards []ShardStatus
}

// MemberStatus is a member of the mesh with what it gossips of itself.
type MemberStatus struct {
	Member
	// Level is the newest feature level the peer speaks; 0 when unknown
	// (not Alive).
	Level uint8
	// NoReplicas marks a client-only peer.
	NoReplicas bool
}

// ShardStatus is one lock shard.
type ShardStatus struct {
	Shard uint64
	// Leader names the peer leading the shard as this peer sees it; ""
	// when none is known (an election, or no replica reachable).
	Leader string
	// Replicas are the shard's replicas in the layout, by peer name.
	Replicas []ReplicaStatus
	// Counted is true when the counts below come from the shard's state:
	// this peer hosts a replica, whose state they are (it may lag the
	// leader's by its Lag).
	Counted bool
	// Sessions, Keys, Holders and Waiters count the shard's live
	// sessions, keys held or waited for, holders and waiters.
	Sessions, Keys, Holders, Waiters int
}

// ReplicaStatus is one replica of a shard.
type ReplicaStatus struct {
	Peer    string
	Replica uint64
	// Leader is true for the replica leading the shard.
	Leader bool
	// Reported is true when the replica's peer answered; Applied and
	// Lag are then set.
	Reported bool
	// Applied is the index of the last Raft entry the replica applied,
	// and Lag how many entries it is behind the most advanced replica
	// that reported.
	Applied, Lag uint64
}

// Top is the most contended keys and the longest current holds across
// the cluster's shards (Node.Top).
type Top struct {
	// Contended are the keys waited for the most, most first: by the
	// total time grants to waiters waited plus the age of the waits going
	// on now.
	Contended []ContendedKey
	// LongestHolds are the holds granted longest ago that still hold,
	// longest first.
	LongestHolds []LongHold
	// Missing lists the shards that did not answer; the lists cover the
	// others.
	Missing []uint64
}

// ContendedKey is a key that was or is waited for.
type ContendedKey struct {
	Key   string
	Shard uint64
	// Waiters is how many wait for the key now, and OldestWait how long
	// the first of them has waited (0 when the shard's leader did not see
	// it queue: see docs/OBSERVABILITY.md).
	Waiters    int
	OldestWait time.Duration
	// Handoffs counts the grants to waiters the shard leader's summary
	// recorded for the key since Since, and TotalWait their summed waits.
	// The summary is approximate (space-saving, bounded per shard): a key
	// that entered it late may be over-counted by at most Overcount.
	Handoffs  uint64
	TotalWait time.Duration
	Overcount time.Duration
	// Since is when the summary started: the answering replica's start.
	Since time.Time
}

// LongHold is a lock held for long.
type LongHold struct {
	Key   string
	Shard uint64
	// Peer and Session identify the holder (as in Holder), Token its grant.
	Peer    string
	Session uint64
	Token   uint64
	// HeldFor is how long ago the grant was made, as the shard leader's
	// replica saw it. AtLeast is true when the grant came before that
	// replica started (or was too long ago to place exactly): it was
	// made at least HeldFor ago.
	HeldFor time.Duration
	AtLeast bool
}

// Status reports this peer's view of the mesh and the cluster's shards
// (see Status). It asks every live peer of the layout for the replicas it
// runs and how far each has applied, at most a second each, in parallel;
// a peer that does not answer leaves its replicas not Reported. It fails
// only when ctx ends or after Close.
func (n *Node) Status(ctx context.Context) (Status, error) {
	if err := nilContext(ctx, "Node.Status"); err != nil {
		return Status{}, err
	}
	if n.peer.IsClosed() {
		return Status{}, ErrClosed
	}
	p := n.peer.Placement()
	st := Status{Peer: n.cfg.Name, Release: release.Version, Level: uint8(layout.LevelOf(p)), Ready: p != nil}
	for _, m := range n.Members() {
		ms := MemberStatus{Member: m}
		if mm, ok := n.peer.Member(m.Name); ok {
			ms.Level, ms.NoReplicas = uint8(mm.Meta.MaxLevel), mm.Meta.NoReplicas
		}
		st.Members = append(st.Members, ms)
	}
	if p == nil {
		return st, ctx.Err()
	}
	st.Cluster = p.ClusterID
	reports := n.peer.AskApplied(ctx, p)
	applied := reports.Applied
	st.Ready = true
	for _, shard := range p.ShardIDs() {
		if shard == layout.MetaShard {
			continue
		}
		ss := ShardStatus{Shard: shard, Leader: knownLeader(reports, p, shard, n.cfg.Name)}
		st.Ready = st.Ready && ss.Leader != ""
		var most uint64
		for _, r := range p.Replicas[shard] {
			rs := ReplicaStatus{Peer: r.Peer, Replica: r.ID, Leader: r.Peer == ss.Leader}
			rs.Applied, rs.Reported = applied[r.Peer][shard]
			most = max(most, rs.Applied)
			ss.Replicas = append(ss.Replicas, rs)
		}
		for i := range ss.Replicas {
			if ss.Replicas[i].Reported {
				ss.Replicas[i].Lag = most - ss.Replicas[i].Applied
			}
		}
		if c, ok := n.peer.LocalCounts(shard); ok {
			ss.Counted = true
			ss.Sessions, ss.Keys, ss.Holders, ss.Waiters = c.Sessions, c.Keys, c.Holders, c.Waiters
		}
		st.Shards = append(st.Shards, ss)
	}
	return st, ctx.Err()
}

// MaxTop is the most keys and holds Top returns of each kind.
const MaxTop = replica.MaxTop

// Top returns the k most contended keys and the k longest current holds
// across the cluster (k from 1 to MaxTop), each shard's as its leader's
// replica observed them: see ContendedKey and LongHold, and
// docs/OBSERVABILITY.md for what is exact and what approximate. Each
// shard is read through its leader (a ReadIndex round) and answers from
// one pass over its keys, so Top is for operators, not for a loop. A
// shard that does not answer within ctx is listed in Missing. Top needs
// feature level 3 (ErrIncompatible below it).
func (n *Node) Top(ctx context.Context, k int) (Top, error) {
	if err := nilContext(ctx, "Node.Top"); err != nil {
		return Top{}, err
	}
	if k < 1 || k > MaxTop {
		return Top{}, fmt.Errorf("%w: Top of %d; ask for 1 to %d", ErrInvalidArgument, k, MaxTop)
	}
	if n.peer.IsClosed() {
		return Top{}, ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
	if err != nil {
		return Top{}, err
	}
	if err := n.familyLevel("contention summaries"); err != nil {
		return Top{}, err
	}
	type shardKey struct {
		shard uint64
		since time.Time
		replica.TopKey
	}
	var top Top
	var keys []shardKey
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, shard := range p.ShardIDs() {
		if shard == layout.MetaShard {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := n.peer.ReadRetrying(ctx, shard, replica.Query{Kind: replica.QueryTop, K: k})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || a.Top == nil {
				top.Missing = append(top.Missing, shard)
				return
			}
			since := time.UnixMilli(a.Top.SinceMillis)
			for _, tk := range a.Top.Keys {
				keys = append(keys, shardKey{shard, since, tk})
			}
			for _, h := range a.Top.Holds {
				top.LongestHolds = append(top.LongestHolds, LongHold{Key: h.Key, Shard: shard, Peer: h.Holder.Owner,
					Session: h.Holder.Label, Token: h.Holder.Token, HeldFor: micros(h.Age.Micros), AtLeast: h.Age.AtLeast || !h.Age.Known})
			}
		}()
	}
	wg.Wait()
	slices.SortFunc(keys, func(a, b shardKey) int { return replica.CompareTopKeys(a.TopKey, b.TopKey) })
	for _, sk := range keys[:min(k, len(keys))] {
		top.Contended = append(top.Contended, ContendedKey{Key: sk.Key, Shard: sk.shard, Waiters: sk.Waiters,
			OldestWait: micros(sk.OldestWait.Micros), Handoffs: sk.Handoffs, TotalWait: micros(sk.WaitMicros),
			Overcount: micros(sk.OvercountMicros), Since: sk.since})
	}
	slices.SortFunc(top.LongestHolds, func(a, b LongHold) int {
		return cmp.Or(cmp.Compare(b.HeldFor, a.HeldFor), cmp.Compare(a.Key, b.Key))
	})
	slices.Sort(top.Missing)
	top.LongestHolds = top.LongestHolds[:min(k, len(top.LongestHolds))]
	if len(top.Missing) > 0 && ctx.Err() != nil {
		return top, ctx.Err()
	}
	return top, nil
}

func micros(us uint64) time.Duration { return time.Duration(us) * time.Microsecond }

// knownLeader is the leader of shard as the replicas that answered know
// it: this peer's own replica's knowledge when it runs one, else the one
// the shard's answering hosts name most (ties to the first by name); ""
// when none knows a leader. Never a cached guess: after the leader died,
// a shard without one is shown as such.
func knownLeader(r peer.Reports, p *layout.Placement, shard uint64, self string) string {
	if l, ok := r.Leaders[self][shard]; ok {
		return l
	}
	votes := map[string]int{}
	best := ""
	for _, host := range p.HostNames(shard) {
		l := r.Leaders[host][shard]
		if l == "" {
			continue
		}
		votes[l]++
		if votes[l] > votes[best] || votes[l] == votes[best] && l < best {
			best = l
		}
	}
	return best
}
