package node

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/level"
	"github.com/lockmesh/lockmesh/internal/replica"
	"github.com/lockmesh/lockmesh/lockfsm"
	"github.com/lockmesh/lockmesh/mesh"
)

// Holder describes one holder or waiter of a key.
type Holder struct {
	// Peer is the name of the peer whose session holds or waits.
	Peer string
	// Session is the id of the Session that holds or waits (Session.ID),
	// the same on every shard; 0 for a session opened on this shard
	// before the cluster ran at feature level 3. Locks taken with
	// Node.Lock belong to one default Session per shard.
	Session uint64
	// ShardSession and Request identify the acquire attempt on the key's
	// shard: ShardSession is the id of the Session's replicated session
	// there, its own on each shard.
	ShardSession, Request uint64
	// Token is the fencing token of a holder; 0 for waiters.
	Token uint64
	// Value is what the holder or waiter attached to its hold (WithValue,
	// Lock.SetValue, Campaign, Leadership.Proclaim); nil for none.
	Value []byte
	// Kind is what the hold is: "mutex", "read" or "write" (of a
	// read/write lock), or "semaphore", whose Permits it takes (1 for
	// every other kind).
	Kind    string
	Permits int
	// Age is how long ago a holder was granted the key, or a waiter
	// queued for it, as the replica that answered saw it; 0 when that
	// replica does not know (it runs a release before ages, or did not see
	// the waiter queue). AtLeast is true when the grant or wait began
	// before that replica started, or too long ago to place exactly: it
	// began at least Age ago.
	Age     time.Duration
	AtLeast bool
}

// KeyInfo is a linearizable snapshot of one key's lock state.
type KeyInfo struct {
	Key     string
	Shard   uint64
	Holders []Holder
	Waiters []Holder // in FIFO order
}

// Inspect returns the current holders and waiters of key, read through the
// Raft log's read index (linearizable).
func (n *Node) Inspect(ctx context.Context, key string) (KeyInfo, error) {
	if err := nilContext(ctx, "Node.Inspect"); err != nil {
		return KeyInfo{}, err
	}
	if err := lockfsm.ValidateKey(key); err != nil {
		return KeyInfo{}, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	if n.peer.IsClosed() {
		return KeyInfo{}, ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
	if err != nil {
		return KeyInfo{}, err
	}
	shard := p.ShardOf(key)
	info := KeyInfo{Key: key, Shard: shard}
	q := replica.Query{Kind: replica.QueryKey, Key: key, Ages: n.peer.ClusterLevel().CarriesTraces()}
	a, err := n.peer.ReadRetrying(ctx, shard, q)
	if err != nil {
		return info, fmt.Errorf("inspect %q: %w", key, err)
	}
	if a.KeyFound {
		info.Holders = withAges(holders(a.Key.Holders), a.HolderAges)
		info.Waiters = withAges(holders(a.Key.Waiters), a.WaiterAges)
	}
	return info, nil
}

// withAges sets the ages of hs from ages, in the same order; a replica of
// a release before ages answers none.
func withAges(hs []Holder, ages []replica.Age) []Holder {
	if len(ages) != len(hs) {
		return hs
	}
	for i, a := range ages {
		if a.Known {
			hs[i].Age, hs[i].AtLeast = micros(a.Micros), a.AtLeast
		}
	}
	return hs
}

func holders(hs []lockfsm.Holder) []Holder {
	out := make([]Holder, len(hs))
	for i, h := range hs {
		out[i] = Holder{Peer: h.Owner, Session: h.Label, ShardSession: h.Session, Request: h.Req, Token: h.Token, Value: h.Value,
			Kind: h.Kind.String(), Permits: int(max(h.Permits, 1))}
	}
	return out
}

// Member is a peer of the mesh as this peer sees it.
type Member struct {
	Name       string
	GossipAddr string
	RaftAddr   string
	RPCAddr    string
	// Alive is true for a peer gossip currently sees alive. It is false for
	// a peer the cluster layout lists but gossip does not (declared dead,
	// left, cut off from this peer, or gossiping metadata this peer cannot
	// read); such an entry has only Name and Cluster set.
	Alive bool
	// Cluster is the id of the cluster the peer belongs to, 0 if none yet.
	Cluster uint64
}

// Members lists, sorted by name, the peers gossip currently sees alive,
// this one included, and as not Alive the peers of the cluster layout (as
// this peer last read it) that gossip does not list. A peer drops out of
// gossip's list when it leaves or when gossip declares it dead (memberlist's
// failure detection, seconds); it stays listed as not Alive until the
// layout forgets it: soon after a Leave, which moved its replicas first,
// and for a dead peer once the cluster has replaced its replicas, some
// time after DeadAfter. A client-only peer (NoReplicas) is in no layout,
// so it simply disappears. Before this peer knows the layout, only
// gossip's live peers are listed. A peer restarted on a wiped DataDir
// under its old Name is Alive, as gossip sees the name, while the cluster
// still waits to replace its old replicas (see Config.DataDir). Members
// returns nil after Close.
func (n *Node) Members() []Member {
	if n.peer.IsClosed() {
		return nil
	}
	var layout []string
	var cluster uint64
	if p := n.peer.Placement(); p != nil {
		cluster = p.ClusterID
		for _, pe := range p.Peers {
			layout = append(layout, pe.Name)
		}
	}
	return listMembers(n.peer.Members(), layout, cluster)
}

// listMembers merges the members gossip lists (today only live ones; see
// mesh.Mesh.Members) with the names of the layout of cluster: a layout
// peer gossip does not list is added, not Alive.
func listMembers(seen []mesh.Member, layout []string, cluster uint64) []Member {
	out := make([]Member, 0, max(len(seen), len(layout)))
	gossiped := make(map[string]bool, len(seen))
	for _, m := range seen {
		gossiped[m.Name] = true
		out = append(out, Member{
			Name: m.Name, GossipAddr: m.Addr, RaftAddr: m.Meta.RaftAddr, RPCAddr: m.Meta.RPCAddr,
			Alive: m.State == mesh.StateAlive, Cluster: m.Meta.Cluster,
		})
	}
	for _, name := range layout {
		if !gossiped[name] {
			out = append(out, Member{Name: name, Cluster: cluster})
		}
	}
	slices.SortFunc(out, func(a, b Member) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// ShardInfo describes one shard of the layout.
type ShardInfo struct {
	Shard uint64
	// Meta is true for the meta shard, which holds the layout itself.
	Meta bool
	// Replicas are the names of the peers hosting the shard.
	Replicas []string
	// ReplicationFactor is how many replicas the shard should have. More
	// than len(Replicas) while there are too few peers for it (a
	// ReplicationFactor above the peer count, or a dead peer not yet
	// replaced); the peer also logs a warning then.
	ReplicationFactor int
	// Leader is the peer leading the shard as far as this peer knows ("" if
	// unknown).
	Leader string
	// Halted, when set, says why this peer's replica of the shard stopped
	// applying its log (an entry or snapshot this release cannot read):
	// it keeps its data and runs again once the peer is upgraded; the
	// shard's other replicas serve it meanwhile.
	Halted *HaltError
}

// ShardOf returns the shard that holds key (Placement lists its replicas
// and leader). A key's shard never changes. It waits (bounded by ctx)
// until the cluster is formed, and fails with ErrInvalidKey for a key
// Lock would refuse.
func (n *Node) ShardOf(ctx context.Context, key string) (uint64, error) {
	if err := nilContext(ctx, "Node.ShardOf"); err != nil {
		return 0, err
	}
	if err := lockfsm.ValidateKey(key); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	if n.peer.IsClosed() {
		return 0, ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
	if err != nil {
		return 0, err
	}
	return p.ShardOf(key), nil
}

// Placement returns the cluster layout: every shard with the peers that
// host it and its leader as far as this peer knows. It waits (bounded by
// ctx) until the cluster is formed.
func (n *Node) Placement(ctx context.Context) ([]ShardInfo, error) {
	if err := nilContext(ctx, "Node.Placement"); err != nil {
		return nil, err
	}
	if n.peer.IsClosed() {
		return nil, ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
	if err != nil {
		return nil, err
	}
	asked := n.peer.AskLeaders(ctx, p)
	var out []ShardInfo
	for _, shard := range p.ShardIDs() {
		leader, ok := asked[shard]
		if !ok {
			leader = n.peer.LeaderGuess(shard)
		}
		out = append(out, ShardInfo{
			Shard: shard, Meta: shard == layout.MetaShard, Replicas: p.HostNames(shard), Leader: leader,
			ReplicationFactor: p.RF, Halted: n.peer.HaltedShard(shard),
		})
	}
	return out, nil
}

// MaxInspectKeys is the most keys one InspectPrefix page returns.
const MaxInspectKeys = replica.MaxInspectKeys

// InspectPrefix returns a page of the keys that start with prefix and are
// held or waited for, in byte order, each as Inspect returns one (holders
// with their values, peers, sessions, tokens and ages; waiters in queue
// order with their ages): at most limit of them (1 to MaxInspectKeys; 0
// is 100) after cursor ("" for the first page), and the cursor of the
// next page, "" after the last. The prefix must hold a whole hash tag
// ("{order-42}/"), so that its keys live on one shard; each page is one
// linearizable read of it, consistent in itself (keys may come and go
// between pages). Needs feature level 4.
func (n *Node) InspectPrefix(ctx context.Context, prefix, cursor string, limit int) (keys []KeyInfo, next string, err error) {
	if err := nilContext(ctx, "Node.InspectPrefix"); err != nil {
		return nil, "", err
	}
	if err := lockfsm.ValidateKey(prefix); err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	switch {
	case limit == 0:
		limit = 100
	case limit < 0 || limit > MaxInspectKeys:
		return nil, "", fmt.Errorf("%w: InspectPrefix of %d keys: a page is 1 to %d keys", ErrInvalidArgument, limit, MaxInspectKeys)
	}
	if cursor != "" && cursor < prefix {
		return nil, "", fmt.Errorf("%w: cursor %q does not follow prefix %q", ErrInvalidArgument, cursor, prefix)
	}
	if n.peer.IsClosed() {
		return nil, "", ErrClosed
	}
	p, err := n.peer.WaitReady(ctx)
	if err != nil {
		return nil, "", err
	}
	if err := n.needLevel(level.Coordination, "inspections by prefix"); err != nil {
		return nil, "", err
	}
	shard, ok := p.PrefixShard(prefix)
	if !ok {
		return nil, "", fmt.Errorf("%w: InspectPrefix(%q): a prefix must hold a whole hash tag, as \"{tag}/\", so that its keys live on one shard", ErrInvalidArgument, prefix)
	}
	a, err := n.peer.ReadRetrying(ctx, shard, replica.Query{Kind: replica.QueryKeys, Key: prefix, After: cursor, K: limit})
	if err != nil {
		return nil, "", fmt.Errorf("inspect prefix %q: %w", prefix, err)
	}
	for i, k := range a.Keys {
		info := KeyInfo{Key: k.Key, Shard: shard, Holders: holders(k.Holders), Waiters: holders(k.Waiters)}
		if i < len(a.KeyAges) {
			info.Holders = withAges(info.Holders, a.KeyAges[i].Holders)
			info.Waiters = withAges(info.Waiters, a.KeyAges[i].Waiters)
		}
		keys = append(keys, info)
	}
	if a.KeysMore && len(keys) > 0 {
		next = keys[len(keys)-1].Key
	}
	return keys, next, nil
}
