package raftnet

import (
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// recordingGate drops every message of shard 9 and records who sent
// what, and what was sent.
type recordingGate struct {
	mu    sync.Mutex
	names [][]string
	sent  int
}

func (g *recordingGate) Batch(names []string, b *pb.MessageBatch) []error {
	g.mu.Lock()
	g.names = append(g.names, names)
	g.mu.Unlock()
	var errs []error
	b.Requests = slices.DeleteFunc(b.Requests, func(m pb.Message) bool {
		if m.ShardID == 9 {
			errs = append(errs, errors.New("shard 9"))
			return true
		}
		return false
	})
	return errs
}

func (g *recordingGate) Chunk(names []string, c *pb.Chunk) error {
	if c.ShardID == 9 {
		return errors.New("shard 9")
	}
	return nil
}

func (g *recordingGate) Sent(b *pb.MessageBatch) {
	g.mu.Lock()
	g.sent++
	g.mu.Unlock()
}

func (g *recordingGate) seen() ([][]string, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.names), g.sent
}

// The gate sees every batch that arrives, with the sender's verified
// certificate names, before dragonboat does: what it removes never
// reaches the handler, a batch left empty is not handed on, a chunk it
// refuses closes the connection, and it hears of every batch sent.
func TestGate(t *testing.T) {
	ca := transporttest.NewCA(t)
	g := &recordingGate{}
	srv := startPeer(t, Config{TLS: ca.Issue("member-1"), Authorize: members, Gate: g})
	conn, err := tls.Dial("tcp", srv.addr, &tls.Config{Certificates: []tls.Certificate{ca.Certificate("member-2")}, RootCAs: ca.Pool(), ServerName: "member-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b := testBatch("p", 3)
	b.Requests[1].ShardID = 9
	allRefused := testBatch("p", 1)
	allRefused.Requests[0].ShardID = 9
	conn.Write(frameOf(kindBatch, mustMarshal(t, allRefused)))
	conn.Write(frameOf(kindBatch, mustMarshal(t, b)))
	srv.in.wait(t, 1)
	srv.in.mu.Lock()
	got := srv.in.batches
	srv.in.mu.Unlock()
	if len(got) != 1 || len(got[0].Requests) != 2 || got[0].Requests[0].ShardID != 3 || got[0].Requests[1].ShardID != 3 {
		t.Fatalf("handler got %+v, want one batch of the 2 messages of shard 3", got)
	}
	names, _ := g.seen()
	if len(names) != 2 || len(names[0]) == 0 || names[0][0] != "member-2" {
		t.Fatalf("gate saw senders %v, want member-2 twice", names)
	}

	// Plaintext: the sender has no names.
	plain := startPeer(t, Config{Gate: g})
	c, err := net.Dial("tcp", plain.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(frameOf(kindBatch, mustMarshal(t, testBatch("p", 1))))
	plain.in.wait(t, 1)
	if names, _ := g.seen(); names[2] != nil {
		t.Fatalf("a plaintext sender was named %v", names[2])
	}
	refusedChunk := testChunk(10)
	refusedChunk.ShardID = 9
	body, err := refusedChunk.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	c2, err := net.Dial("tcp", plain.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write(frameOf(kindChunk, body))
	if !closedByPeer(c2, 2*time.Second) {
		t.Fatal("a refused chunk left its connection open")
	}
	if _, chunks := plain.in.count(); chunks != 0 {
		t.Fatalf("%d refused chunks handled", chunks)
	}

	// Sending tells the gate.
	sender := startPeer(t, Config{Gate: g})
	out, err := sender.tr.GetConnection(t.Context(), plain.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := out.SendMessageBatch(testBatch("p", 1)); err != nil {
		t.Fatal(err)
	}
	if _, sent := g.seen(); sent != 1 {
		t.Fatalf("gate heard of %d sent batches, want 1", sent)
	}
}

// A batch of empty messages is 2 bytes a message on the wire and
// hundreds decoded: what decoding would allocate is charged to
// MaxBuffered before Unmarshal runs, so such a frame closes its
// connection unread. Before, 4 MiB of them allocated 620 MiB.
func TestDecodeAmplificationRefused(t *testing.T) {
	srv := startPeer(t, Config{})
	body := make([]byte, 0, 4<<20)
	for len(body) < 4<<20 {
		body = append(body, 0x0a, 0x00) // Requests: an empty message
	}
	extra, err := decodedExtra(body)
	if err != nil {
		t.Fatal(err)
	}
	if extra <= srv.tr.cfg.MaxBuffered {
		t.Fatalf("2M empty messages cost %d, within MaxBuffered %d", extra, srv.tr.cfg.MaxBuffered)
	}
	c, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var before, after runtimeMem
	before.read()
	go c.Write(frameOf(kindBatch, body))
	if !closedByPeer(c, 10*time.Second) {
		t.Fatal("an amplifying batch left its connection open")
	}
	after.read()
	if grew := int64(after.total) - int64(before.total); grew > 64<<20 {
		t.Fatalf("reading the frame allocated %d MiB", grew>>20)
	}
	if b, _ := srv.in.count(); b != 0 {
		t.Fatal("the batch was handled")
	}

	// An ordinary batch costs a small multiple of its bytes, and a
	// snapshot riding in a batch is refused.
	ordinary := mustMarshal(t, testBatch("p", 64))
	if extra, err := decodedExtra(ordinary); err != nil || extra > 8*len(ordinary) {
		t.Fatalf("a batch of 64 replicates of %d bytes: extra %d, %v", len(ordinary), extra, err)
	}
	withSnapshot := testBatch("p", 1)
	withSnapshot.Requests[0].Snapshot = pb.Snapshot{Index: 5, Term: 1, Membership: pb.Membership{Addresses: map[uint64]string{1: "a", 2: "b"}}}
	if _, err := decodedExtra(mustMarshal(t, withSnapshot)); err == nil {
		t.Fatal("a batch carrying a snapshot passed")
	}
}

// runtimeMem reads the total bytes allocated so far.
type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	m.total = s.TotalAlloc
}
