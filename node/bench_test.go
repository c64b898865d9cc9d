package node

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkLockUnlock measures one uncontended lock+unlock from one peer of
// a 3-peer in-process cluster (in-memory disks: this shows lockmesh's own
// overhead, not fsync).
func BenchmarkLockUnlock(b *testing.B) {
	peers := startCluster(b, clusterOpts{peers: 3, rf: 3, shards: 16, ttl: 10 * time.Second})
	n := peers[0].node
	ctx := ctxT(b, time.Hour)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		l, err := n.Lock(ctx, fmt.Sprintf("k%d", i%1000))
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLockUnlockParallel runs many concurrent callers on distinct keys.
func BenchmarkLockUnlockParallel(b *testing.B) {
	peers := startCluster(b, clusterOpts{peers: 3, rf: 3, shards: 16, ttl: 10 * time.Second})
	ctx := ctxT(b, time.Hour)
	var next atomic.Int64
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(1)
		n := peers[i%3].node
		for pb.Next() {
			l, err := n.Lock(ctx, fmt.Sprintf("k%d-%d", i, next.Add(1)%100000))
			if err != nil {
				b.Error(err)
				return
			}
			if err := l.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
