package mesh

import (
	"errors"
	"sync"
	"testing"

	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
)

var _ config.NodeRegistryFactory = registryFactory{}

type addrBook struct {
	mu    sync.Mutex
	addrs map[string]string
}

func (b *addrBook) lookup(id string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.addrs[id]
	return a, ok
}

func (b *addrBook) set(id, addr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addrs[id] = addr
}

func mustResolve(t *testing.T, r raftio.INodeRegistry, shard, replica uint64, want string) {
	t.Helper()
	addr, key, err := r.Resolve(shard, replica)
	if err != nil {
		t.Fatalf("Resolve(%d, %d): %v", shard, replica, err)
	}
	if addr != want || key != want {
		t.Fatalf("Resolve(%d, %d) = (%q, %q), want (%q, %q)", shard, replica, addr, key, want, want)
	}
}

func mustNotResolve(t *testing.T, r raftio.INodeRegistry, shard, replica uint64) {
	t.Helper()
	if addr, _, err := r.Resolve(shard, replica); !errors.Is(err, ErrUnknownTarget) {
		t.Fatalf("Resolve(%d, %d) = %q, %v; want ErrUnknownTarget", shard, replica, addr, err)
	}
}

func TestRegistry(t *testing.T) {
	book := &addrBook{addrs: map[string]string{"nh-a": "10.0.0.1:7947", "nh-b": "10.0.0.2:7947"}}
	r := NewRegistry(book.lookup)
	mustNotResolve(t, r, 1, 1)

	r.Add(1, 1, "nh-a")
	r.Add(1, 2, "nh-b")
	r.Add(2, 1, "nh-a")
	r.Add(2, 3, "nh-c") // registered, but nobody gossips nh-c yet
	mustResolve(t, r, 1, 1, "10.0.0.1:7947")
	mustResolve(t, r, 1, 2, "10.0.0.2:7947")
	mustResolve(t, r, 2, 1, "10.0.0.1:7947")
	mustNotResolve(t, r, 2, 3)
	mustNotResolve(t, r, 3, 1)

	// The address follows the lookup: a peer that restarts elsewhere.
	book.set("nh-c", "10.0.0.3:7947")
	mustResolve(t, r, 2, 3, "10.0.0.3:7947")
	book.set("nh-a", "10.0.0.9:7947")
	mustResolve(t, r, 1, 1, "10.0.0.9:7947")

	r.Remove(1, 1)
	mustNotResolve(t, r, 1, 1)
	mustResolve(t, r, 1, 2, "10.0.0.2:7947")

	r.RemoveShard(2)
	mustNotResolve(t, r, 2, 1)
	mustNotResolve(t, r, 2, 3)
	mustResolve(t, r, 1, 2, "10.0.0.2:7947")

	// Re-adding with a different target replaces it.
	r.Add(1, 2, "nh-c")
	mustResolve(t, r, 1, 2, "10.0.0.3:7947")
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestRegistryFactoryOptions(t *testing.T) {
	book := &addrBook{addrs: map[string]string{"good": "h:1"}}
	r := newRegistry(book.lookup, 4, func(s string) bool { return s == "good" }, nil)
	r.Add(6, 1, "good")
	r.Add(6, 2, "bad") // dragonboat's registry would panic; this one ignores it
	addr, key, err := r.Resolve(6, 1)
	if err != nil || addr != "h:1" || key != "h:1-2" {
		t.Fatalf("Resolve with 4 stream connections = (%q, %q, %v), want (h:1, h:1-2, nil)", addr, key, err)
	}
	mustNotResolve(t, r, 6, 2)
}
