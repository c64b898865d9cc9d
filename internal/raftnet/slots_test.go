package raftnet

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// floodSize is how many stalled connections the slot tests open: more
// than DefaultMaxConns.
const floodSize = 1100

// floodSources are where a slot test's flood comes from: the address
// every peer of a loopback cluster uses (and every local process), and
// eight others, each filled to DefaultMaxConnsPerIP (1,024 together).
var floodSources = []struct {
	name string
	ips  []string
}{
	{"from 127.0.0.1", []string{"127.0.0.1"}},
	{"from 127.0.0.2-9", []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"}},
}

// flood opens floodSize connections to addr that stall, spread over ips
// in turn; with hello, every other one stalls in the middle of its TLS
// handshake instead of before it.
func flood(t *testing.T, addr string, ips []string, hello []byte) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for i, ip := range ips {
		n := floodSize / len(ips)
		if i == 0 {
			n += floodSize % len(ips)
		}
		conns = append(conns, transporttest.Stall(t, addr, ip, n/2, nil)...)
		conns = append(conns, transporttest.Stall(t, addr, ip, n-n/2, hello)...)
	}
	return conns
}

// Issue 27, finding 8: 1,024 idle connections from 127.0.0.2-9 (or 128
// from the peers' own 127.0.0.1) held every slot of the Raft port
// (MaxConns, MaxConnsPerIP) until HandshakeTimeout, and closed a peer's
// new Raft connection at once. Connections that have proved nothing now
// share a small pool whose oldest make room for newer ones: a member
// (by its certificate, or without TLS anyone who sends a valid frame)
// still connects and is delivered, and at most DefaultMaxUnprovenConns
// of the flood stay open. The handshake timeout is a minute, so only
// that rule can free slots.
func TestUnprovenFloodKeepsNoMemberOut(t *testing.T) {
	transporttest.NeedFiles(t, 4*floodSize+256)
	ca := transporttest.NewCA(t)
	for _, mode := range []struct {
		name           string
		server, member Config
	}{
		{"TLS", Config{TLS: ca.Issue("member-1"), Authorize: members}, Config{TLS: ca.Issue("member-2"), Authorize: members}},
		{"plaintext", Config{}, Config{}},
	} {
		for _, src := range floodSources {
			t.Run(mode.name+" "+src.name, func(t *testing.T) {
				cfg := mode.server
				cfg.HandshakeTimeout = time.Minute
				srv := startPeer(t, cfg)
				var hello []byte
				if cfg.TLS != nil {
					hello = transporttest.ClientHello(t, ca.Issue("stranger"))
				}
				stalled := flood(t, srv.addr, src.ips, hello)
				defer transporttest.CloseAll(stalled)

				m := startPeer(t, mode.member)
				conn, err := m.tr.GetConnection(context.Background(), srv.addr)
				if err != nil {
					t.Fatalf("a member's new connection during a flood of %d stalled ones %s: %v", floodSize, src.name, err)
				}
				defer conn.Close()
				if err := conn.SendMessageBatch(testBatch("member-2", 1)); err != nil {
					t.Fatalf("a member's batch during the flood: %v", err)
				}
				srv.in.wait(t, 1)
				open := transporttest.Open(stalled, 500*time.Millisecond)
				t.Logf("member delivered; %d of %d stalled connections still open", open, len(stalled))
				if open > DefaultMaxUnprovenConns {
					t.Errorf("%d stalled connections held, want at most DefaultMaxUnprovenConns (%d)", open, DefaultMaxUnprovenConns)
				}
				// The member's connection is proven: it stays, whatever
				// comes after it.
				flood(t, srv.addr, src.ips, hello)
				if err := conn.SendMessageBatch(testBatch("member-2", 1)); err != nil {
					t.Fatalf("the member's batch after a second flood: %v", err)
				}
				srv.in.wait(t, 1)
			})
		}
	}
}

// Connections that sent nothing are never refused: one over
// MaxConnsPerIP from an IP closes that IP's oldest, and one over
// MaxUnprovenConns the oldest of all. Without TLS, connections that have
// sent a valid frame are capped by MaxConnsPerIP and MaxConns: one more
// is closed after its first frame.
func TestConnectionCaps(t *testing.T) {
	srv := startPeer(t, Config{MaxConns: 4, MaxUnprovenConns: 3, MaxConnsPerIP: 2, HandshakeTimeout: time.Minute})
	silent := transporttest.Stall(t, srv.addr, "127.0.0.2", 3, nil)
	if !closedByPeer(silent[0], 2*time.Second) {
		t.Fatal("the oldest of 3 silent connections from one IP with MaxConnsPerIP 2 stayed open")
	}
	silent = append(silent[1:], transporttest.Stall(t, srv.addr, "127.0.0.3", 2, nil)...)
	if !closedByPeer(silent[0], 2*time.Second) {
		t.Fatal("the oldest of 4 silent connections with MaxUnprovenConns 3 stayed open")
	}
	if open := transporttest.Open(silent[1:], 200*time.Millisecond); open != 3 {
		t.Fatalf("%d of the 3 newest silent connections open, want 3", open)
	}

	batch := frameOf(kindBatch, mustMarshal(t, testBatch("p", 1)))
	send := func(ip string) net.Conn {
		c := transporttest.Stall(t, srv.addr, ip, 1, batch)[0]
		return c
	}
	kept := []net.Conn{send("127.0.0.4"), send("127.0.0.4")}
	srv.in.wait(t, 2)
	// A connection proves itself before its first frame is handed on, so
	// the two whose frames arrived hold their slots, and the next is
	// refused without its frame being handed on.
	if over := send("127.0.0.4"); !closedByPeer(over, 2*time.Second) {
		t.Fatal("a 3rd connection that sent a frame from one IP stayed open with MaxConnsPerIP 2")
	}
	kept = append(kept, send("127.0.0.5"), send("127.0.0.5"))
	srv.in.wait(t, 2)
	if over := send("127.0.0.6"); !closedByPeer(over, 2*time.Second) {
		t.Fatal("a 5th connection that sent a frame stayed open with MaxConns 4")
	}
	// The kept ones are still served; the refused ones handed on nothing.
	for _, c := range kept {
		c.Write(batch)
	}
	srv.in.wait(t, len(kept))
	if batches, _ := srv.in.count(); batches != 2*len(kept) {
		t.Fatalf("%d batches handed on, want %d: only the kept connections' frames", batches, 2*len(kept))
	}
}
