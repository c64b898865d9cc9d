package faultnet

import (
	"errors"
	"io"
	"log"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// gossipPair is two gossip transports, a and b, on loopback under one
// network, plus a's inner transport, which sends around the rules.
type gossipPair struct {
	net          *Network
	a, b         memberlist.NodeAwareTransport
	rawA         memberlist.NodeAwareTransport
	addrA, addrB string
}

func newGossipPair(t *testing.T) *gossipPair {
	t.Helper()
	inner := func() *memberlist.NetTransport {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{"127.0.0.1"},
			Logger:    log.New(io.Discard, "", 0),
		})
		if err != nil {
			t.Fatal(err)
		}
		return nt
	}
	ia, ib := inner(), inner()
	gp := &gossipPair{
		net:   New(),
		rawA:  ia,
		addrA: net.JoinHostPort("127.0.0.1", itoa(ia.GetAutoBindPort())),
		addrB: net.JoinHostPort("127.0.0.1", itoa(ib.GetAutoBindPort())),
	}
	peerOf := func(addr string) string {
		switch addr {
		case gp.addrA:
			return "a"
		case gp.addrB:
			return "b"
		}
		return ""
	}
	gp.a = gp.net.GossipTransport("a", ia, peerOf)
	gp.b = gp.net.GossipTransport("b", ib, peerOf)
	t.Cleanup(func() {
		_ = gp.a.Shutdown()
		_ = gp.b.Shutdown()
	})
	return gp
}

func itoa(i int) string { return (&net.TCPAddr{Port: i}).String()[1:] }

// received reports whether b gets a packet within wait.
func received(tr memberlist.NodeAwareTransport, wait time.Duration) bool {
	select {
	case <-tr.PacketCh():
		return true
	case <-time.After(wait):
		return false
	}
}

func TestGossipPacketsObeyRules(t *testing.T) {
	gp := newGossipPair(t)
	send := func(tr memberlist.NodeAwareTransport) {
		t.Helper()
		if _, err := tr.WriteToAddress([]byte("ping"), memberlist.Address{Addr: gp.addrB, Name: "b"}); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	send(gp.a)
	if !received(gp.b, 2*time.Second) {
		t.Fatal("healthy link lost a packet")
	}
	gp.net.OneWay("a", "b")
	send(gp.a) // dropped by a, without an error
	if received(gp.b, 200*time.Millisecond) {
		t.Fatal("a packet crossed a cut link")
	}
	send(gp.rawA) // sent around a's rules: b must drop it on arrival
	if received(gp.b, 200*time.Millisecond) {
		t.Fatal("b accepted a packet from a peer whose link to it is cut")
	}
	// The reverse direction still works.
	if _, err := gp.b.WriteTo([]byte("pong"), gp.addrA); err != nil {
		t.Fatal(err)
	}
	if !received(gp.a, 2*time.Second) {
		t.Fatal("a one-way cut a->b lost a packet b->a")
	}
	gp.net.Heal()
	send(gp.a)
	if !received(gp.b, 2*time.Second) {
		t.Fatal("a packet was lost after Heal")
	}
}

func TestGossipStreamsObeyRules(t *testing.T) {
	gp := newGossipPair(t)
	accept := func() net.Conn {
		t.Helper()
		select {
		case c := <-gp.b.StreamCh():
			return c
		case <-time.After(2 * time.Second):
			return nil
		}
	}
	c, err := gp.a.DialAddressTimeout(memberlist.Address{Addr: gp.addrB, Name: "b"}, time.Second)
	if err != nil {
		t.Fatalf("healthy dial: %v", err)
	}
	defer c.Close()
	s := accept()
	if s == nil {
		t.Fatal("b never accepted a's stream")
	}
	defer s.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		t.Fatalf("read on a healthy stream: %v", err)
	}
	// Cutting either direction breaks the live stream on both ends.
	gp.net.OneWay("b", "a")
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Fatal("read on a cut stream succeeded")
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write on a cut stream succeeded")
	}
	if _, err := gp.a.DialTimeout(gp.addrB, time.Second); !errors.Is(err, ErrCut) {
		t.Fatalf("dial across a one-way cut: %v, want ErrCut", err)
	}
	// A stream from a that arrives while the link is cut (dialed just
	// before the cut, here around a's rules) is closed by b, never handed
	// to memberlist: b names the dialer by the stream's address, as a's
	// transport registers it after every dial.
	raw, err := gp.rawA.DialTimeout(gp.addrB, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	gp.net.mu.Lock()
	gp.net.addOriginLocked(raw.LocalAddr().String(), "a")
	gp.net.mu.Unlock()
	if s := accept(); s != nil {
		t.Fatal("b handed memberlist a stream from a cut peer")
	}
	raw.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := raw.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read on a stream b refused: %v, want EOF (b closed it)", err)
	}
	gp.net.Heal()
	c2, err := gp.a.DialTimeout(gp.addrB, time.Second)
	if err != nil {
		t.Fatalf("dial after Heal: %v", err)
	}
	defer c2.Close()
	if s := accept(); s == nil {
		t.Fatal("b did not accept a stream after Heal")
	} else {
		s.Close()
	}
}

// Shutdown returns even with packets and streams that nobody reads: the
// inner transport's listeners block on unbuffered channels until drained.
func TestGossipTransportShutdown(t *testing.T) {
	gp := newGossipPair(t)
	for i := 0; i < 3; i++ {
		if _, err := gp.a.WriteTo([]byte("unread"), gp.addrB); err != nil {
			t.Fatal(err)
		}
		if c, err := gp.a.DialTimeout(gp.addrB, time.Second); err == nil {
			defer c.Close()
		}
	}
	time.Sleep(100 * time.Millisecond) // let them reach b's listeners
	done := make(chan error, 1)
	go func() { done <- gp.b.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown hung on undelivered packets or streams")
	}
	if err := gp.b.Shutdown(); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
}
