package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/replica"
)

// hostileRaftHeader is the 20 bytes dragonboat's TCP transport reads
// before a Raft message: its magic and an 18-byte header (kind 100,
// message batch) with a valid checksum, claiming size bytes of body.
func hostileRaftHeader(size uint64) []byte {
	b := make([]byte, 20)
	b[0], b[1] = 0xAE, 0x7D
	h := b[2:]
	binary.BigEndian.PutUint16(h, 100)
	binary.BigEndian.PutUint64(h[2:], size)
	binary.BigEndian.PutUint32(h[10:], crc32.ChecksumIEEE(h))
	return b
}

// TestRaftPortHostileHeader sends 20-byte headers claiming absurd sizes
// to a peer's RaftAddr, the real TCP port of a real 3-peer cluster (no
// injected transport: the test hooks are empty), and checks that the peer
// closes those connections and still serves locks and takes part in Raft.
//
// Before raftnet, dragonboat's TCP transport allocated the claimed size
// at once: the first header ended this test binary with "panic: runtime
// error: makeslice: len out of range".
func TestRaftPortHostileHeader(t *testing.T) {
	peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(int, *Config) {})
	target := peers[1]
	lockAndUnlock(t, target.node, "raftport/before")

	for _, size := range []uint64{1 << 62, 1<<63 - 1, 1 << 40, 1 << 31} {
		c, err := net.Dial("tcp", target.cfg.RaftAddr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(hostileRaftHeader(size)); err != nil {
			t.Fatalf("write header claiming %d bytes: %v", size, err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s kept a connection open 5s after a header claiming %d bytes", target.cfg.Name, size)
		}
		c.Close()
	}

	// The peer still serves locks, on every shard (the keys spread over
	// the 4 shards), and its replicas still receive Raft entries: a
	// session opened through peer-1 is applied by the target's replica.
	for i := range 8 {
		lockAndUnlock(t, target.node, fmt.Sprintf("raftport/after-%d", i))
	}
	ctx := ctxT(t, 10*time.Second)
	l, err := peers[0].node.Lock(ctx, "raftport/held")
	if err != nil {
		t.Fatal(err)
	}
	shard := peers[0].node.peer.Placement().ShardOf("raftport/held")
	pollUntil(t, 10*time.Second, target.cfg.Name+"'s replica applies peer-1's session", func() bool {
		v, err := target.node.peer.NodeHost().StaleRead(shard, replica.Query{Kind: replica.QuerySessions})
		return err == nil && len(v.(replica.Answer).Sessions) > 0
	})
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
