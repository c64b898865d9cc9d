package mesh

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
)

// Registry is a dragonboat node registry (raftio.INodeRegistry) for
// NodeHosts that address replicas by NodeHostID, which dragonboat v4 does
// whenever a registry is configured (NodeHostConfig.Expert.NodeRegistryFactory
// here; see [Mesh.NodeRegistryFactory]): it records which NodeHostID hosts
// each (shard, replica) and resolves that NodeHostID to a raft address
// through a lookup function, normally the gossip view of a [Mesh].
//
// All methods are safe for concurrent use. Resolve is on dragonboat's send
// path, so it takes only a read lock and calls lookup once.
type Registry struct {
	lookup func(nodeHostID string) (raftAddr string, ok bool)
	// partitions is dragonboat's stream connection count; with more than
	// one, connection keys spread shards over that many connections.
	partitions uint64
	// validate is dragonboat's check on targets; nil accepts all.
	validate config.TargetValidator
	log      *slog.Logger

	mu      sync.RWMutex
	targets map[raftio.NodeInfo]string // (shard, replica) -> NodeHostID
}

var _ raftio.INodeRegistry = (*Registry)(nil)

// NewRegistry returns a Registry that resolves NodeHostIDs with lookup,
// which must be safe for concurrent use and must not block. Resolve
// returns the address as both the address and the connection key, as
// dragonboat does with one stream connection.
func NewRegistry(lookup func(nodeHostID string) (raftAddr string, ok bool)) *Registry {
	return newRegistry(lookup, 1, nil, nil)
}

func newRegistry(lookup func(string) (string, bool), partitions uint64,
	validate config.TargetValidator, log *slog.Logger) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{
		lookup:     lookup,
		partitions: partitions,
		validate:   validate,
		log:        log,
		targets:    make(map[raftio.NodeInfo]string),
	}
}

// Add records that replicaID of shardID runs on the NodeHost with the given
// NodeHostID. A target that fails dragonboat's validator is logged and
// ignored (dragonboat's own registry panics instead); re-adding a replica
// with a different target replaces it and logs a warning.
func (r *Registry) Add(shardID, replicaID uint64, nodeHostID string) {
	if r.validate != nil && !r.validate(nodeHostID) {
		r.log.Error("mesh: registry ignores invalid raft target",
			"shard", shardID, "replica", replicaID, "target", nodeHostID)
		return
	}
	key := raftio.GetNodeInfo(shardID, replicaID)
	r.mu.Lock()
	old, had := r.targets[key]
	r.targets[key] = nodeHostID
	r.mu.Unlock()
	if had && old != nodeHostID {
		r.log.Warn("mesh: registry target changed",
			"shard", shardID, "replica", replicaID, "old", old, "new", nodeHostID)
	}
}

// Remove forgets replicaID of shardID.
func (r *Registry) Remove(shardID, replicaID uint64) {
	r.mu.Lock()
	delete(r.targets, raftio.GetNodeInfo(shardID, replicaID))
	r.mu.Unlock()
}

// RemoveShard forgets every replica of shardID.
func (r *Registry) RemoveShard(shardID uint64) {
	r.mu.Lock()
	for k := range r.targets {
		if k.ShardID == shardID {
			delete(r.targets, k)
		}
	}
	r.mu.Unlock()
}

// Resolve returns the raft address of replicaID of shardID and the key
// dragonboat uses to pick a connection for it. It fails with
// [ErrUnknownTarget] when the replica was never added or when lookup does
// not know its NodeHostID (the peer is dead, left, or not yet gossiped).
func (r *Registry) Resolve(shardID, replicaID uint64) (string, string, error) {
	r.mu.RLock()
	nhid, ok := r.targets[raftio.GetNodeInfo(shardID, replicaID)]
	r.mu.RUnlock()
	if !ok {
		return "", "", fmt.Errorf("%w: shard %d replica %d is not registered", ErrUnknownTarget, shardID, replicaID)
	}
	addr, ok := r.lookup(nhid)
	if !ok || addr == "" {
		return "", "", fmt.Errorf("%w: shard %d replica %d: no live member gossips NodeHostID %s",
			ErrUnknownTarget, shardID, replicaID, nhid)
	}
	if r.partitions > 1 {
		return addr, fmt.Sprintf("%s-%d", addr, shardID%r.partitions), nil
	}
	return addr, addr, nil
}

// Close releases nothing: the Registry holds no resources of its own, and
// the [Mesh] behind it is closed by its owner. It always returns nil.
func (r *Registry) Close() error { return nil }

// registryFactory adapts a Mesh to config.NodeRegistryFactory.
type registryFactory struct{ m *Mesh }

// Create is called by dragonboat's NewNodeHost.
func (f registryFactory) Create(nhid string, streamConnections uint64,
	v config.TargetValidator) (raftio.INodeRegistry, error) {
	return newRegistry(f.m.lookupRaftAddr, streamConnections, v, f.m.log), nil
}
