package faultnet

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	pb "github.com/lni/dragonboat/v4/raftpb"
)

func TestRules(t *testing.T) {
	n := New()
	if !n.Allowed("a", "b") {
		t.Fatal("a healthy network cuts a->b")
	}
	n.Partition([]string{"a"}, []string{"b", "c"})
	for _, l := range [][2]string{{"a", "b"}, {"b", "a"}, {"a", "c"}, {"c", "a"}} {
		if n.Allowed(l[0], l[1]) {
			t.Errorf("partition left %s->%s up", l[0], l[1])
		}
	}
	if !n.Allowed("b", "c") || !n.Allowed("c", "b") {
		t.Error("partition cut a link inside a group")
	}
	n.Heal()
	n.OneWay("a", "b")
	if n.Allowed("a", "b") || !n.Allowed("b", "a") {
		t.Error("OneWay(a, b) must cut a->b only")
	}
	n.Heal()
	n.Isolate("c")
	if n.Allowed("c", "a") || n.Allowed("b", "c") || !n.Allowed("a", "b") {
		t.Error("Isolate(c) must cut exactly the links of c")
	}
	if !n.Allowed("", "c") || !n.Allowed("c", "c") {
		t.Error("unknown peers and self links are never cut")
	}
	n.Rejoin("c")
	if !n.Allowed("c", "a") {
		t.Error("Rejoin(c) left c cut off")
	}
	n.Heal()
	n.DropRate("a", "b", 1)
	if ok, _ := n.transmit("a", "b"); ok {
		t.Error("DropRate 1 let a message through")
	}
	if ok, _ := n.transmit("b", "a"); !ok {
		t.Error("DropRate(a, b) dropped b->a")
	}
	n.Heal()
	n.Delay("a", "b", 30*time.Millisecond)
	if _, wait := n.transmit("a", "b"); wait != 30*time.Millisecond {
		t.Errorf("delay a->b = %v, want 30ms", wait)
	}
	n.Heal()
	if ok, wait := n.transmit("a", "b"); !ok || wait != 0 {
		t.Error("Heal left a rule behind")
	}
}

// fakeConn records what reaches the wire.
type fakeConn struct{ batches, chunks int }

func (f *fakeConn) Close()                                 {}
func (f *fakeConn) SendMessageBatch(pb.MessageBatch) error { f.batches++; return nil }
func (f *fakeConn) SendChunk(pb.Chunk) error               { f.chunks++; return nil }

func TestRaftConnectionsObeyRules(t *testing.T) {
	n := New()
	wire := &fakeConn{}
	msg := &raftConn{IConnection: wire, net: n, self: "a", peer: "b"}
	snap := &snapshotConn{ISnapshotConnection: wire, net: n, self: "a", peer: "b"}

	if err := msg.SendMessageBatch(pb.MessageBatch{}); err != nil || wire.batches != 1 {
		t.Fatalf("healthy link: err %v, %d batches on the wire", err, wire.batches)
	}
	n.OneWay("b", "a") // the reverse cut does not stop a->b
	if err := msg.SendMessageBatch(pb.MessageBatch{}); err != nil || wire.batches != 2 {
		t.Fatalf("reverse cut: err %v, %d batches", err, wire.batches)
	}
	n.OneWay("a", "b")
	if err := msg.SendMessageBatch(pb.MessageBatch{}); err != nil || wire.batches != 2 {
		t.Fatalf("cut link: err %v (want nil: lost silently), %d batches (want 2)", err, wire.batches)
	}
	if err := snap.SendChunk(pb.Chunk{}); !errors.Is(err, ErrCut) || wire.chunks != 0 {
		t.Fatalf("cut snapshot link: err %v, %d chunks", err, wire.chunks)
	}
	n.Heal()
	n.Delay("a", "b", 40*time.Millisecond)
	start := time.Now()
	if err := snap.SendChunk(pb.Chunk{}); err != nil || wire.chunks != 1 {
		t.Fatalf("delayed chunk: err %v, %d chunks", err, wire.chunks)
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Fatalf("chunk sent after %v, want the 40ms delay", d)
	}
	if got := n.SnapshotChunks("a", "b"); got != 1 {
		t.Fatalf("SnapshotChunks(a, b) = %d, want the 1 delivered chunk", got)
	}
	if !n.RaftTransportFactory("a", func(string) string { return "b" }).Validate("peer-1:1") {
		t.Fatal("the factory must accept plain-string addresses")
	}
}

// echoServer accepts connections and echoes them until closed.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().String()
}

func TestDialerObeysRules(t *testing.T) {
	addr := echoServer(t)
	n := New()
	dial := n.Dialer("a", func(string) string { return "b" })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	c, err := dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip := func() error {
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		buf := make([]byte, 1)
		_, err := io.ReadFull(c, buf)
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatalf("healthy link: %v", err)
	}
	// A reader blocked on the connection is woken by the cut, which also
	// closes the socket.
	readErr := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		readErr <- err
	}()
	time.Sleep(20 * time.Millisecond)
	n.OneWay("b", "a") // either direction breaks a stream
	select {
	case err := <-readErr:
		if err == nil {
			t.Fatal("read on a cut link succeeded")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("blocked read not woken by the cut")
	}
	if err := roundTrip(); err == nil {
		t.Fatal("round trip on a cut link succeeded")
	}
	if _, err := dial(ctx, addr); !errors.Is(err, ErrCut) {
		t.Fatalf("dial across a one-way cut: %v, want ErrCut", err)
	}
	n.Heal()
	n.Delay("a", "b", 50*time.Millisecond)
	if c, err = dial(ctx, addr); err != nil {
		t.Fatalf("dial after Heal: %v", err)
	}
	defer c.Close()
	start := time.Now()
	if err := roundTrip(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Fatalf("round trip took %v, want at least the 50ms write delay", d)
	}
	n.Isolate("b")
	if err := roundTrip(); err == nil {
		t.Fatal("round trip to an isolated peer succeeded")
	}
}
