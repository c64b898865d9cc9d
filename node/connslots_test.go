package node

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/peer"
	"github.com/lockmesh/lockmesh/transport"
	"github.com/lockmesh/lockmesh/transport/transporttest"
)

// slotFlood is how many stalled connections TestSecurityConnectionSlots
// opens to a port at once: more than either port's MaxConns (1024).
const slotFlood = 1100

// Issue 27, finding 8, on a cluster with GossipKey, TLS and RaftTLS:
// 1,022 idle RPC connections from 127.0.0.1 (counted as the peers' by
// address) and 1,024 idle Raft connections from 127.0.0.2-9 each made a
// real peer's new connection fail. Here peer-1's RPC and Raft ports are
// flooded in turn with 1,100 connections, half sending nothing and half
// stopping after their ClientHello, from 127.0.0.1 and from 127.0.0.2-9;
// while each flood is held, a new connection with peer-2's certificate
// must be served on the flooded port (an RPC answered; on the Raft port,
// dragonboat's end mark answered after the handshake), and every peer
// must still lock and unlock.
func TestSecurityConnectionSlots(t *testing.T) {
	transporttest.NeedFiles(t, 3*slotFlood+1024)
	dir := t.TempDir()
	ca := transporttest.NewCA(t)
	key := randomKey(t, 32)
	peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3}, func(_ int, c *Config) { hardened(c, ca, dir, key) })
	member := ca.Issue("peer-2")
	hello := transporttest.ClientHello(t, ca.Issue("stranger"))

	ports := []struct {
		name, addr string
		connect    func() error
	}{
		{"RPC", peers[0].node.peer.RPCAddr(), func() error {
			c, err := transport.NewClient(transport.Config{TLS: member, DialTimeout: 10 * time.Second})
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Call(ctxT(t, 10*time.Second), peers[0].node.peer.RPCAddr(), peer.MethodStatus, nil)
			return err
		}},
		{"Raft", peers[0].cfg.RaftAddr, func() error {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", peers[0].cfg.RaftAddr, member)
			if err != nil {
				return err
			}
			defer c.Close()
			// dragonboat's end mark (its "poison", two zero bytes), which
			// the port answers in kind: it is served, not just accepted.
			c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write([]byte{0, 0}); err != nil {
				return err
			}
			ack := make([]byte, 2)
			if _, err := io.ReadFull(c, ack); err != nil || !bytes.Equal(ack, []byte{0, 0}) {
				return fmt.Errorf("end mark answered with %x, %v", ack, err)
			}
			return nil
		}},
	}
	sources := []struct {
		name string
		ips  []string
	}{
		{"127.0.0.1", []string{"127.0.0.1"}},
		{"127.0.0.2-9", []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"}},
	}
	for _, port := range ports {
		for _, src := range sources {
			var flood []net.Conn
			for i, ip := range src.ips {
				n := slotFlood / len(src.ips)
				if i == 0 {
					n += slotFlood % len(src.ips)
				}
				flood = append(flood, transporttest.Stall(t, port.addr, ip, n/2, nil)...)
				flood = append(flood, transporttest.Stall(t, port.addr, ip, n-n/2, hello)...)
			}
			if err := port.connect(); err != nil {
				t.Fatalf("%s port flooded from %s: peer-2's new connection: %v", port.name, src.name, err)
			}
			for _, p := range peers {
				lockAndUnlock(t, p.node, fmt.Sprintf("slots/%s/%s/%s", port.name, src.name, p.cfg.Name))
			}
			t.Logf("%s port flooded with %d stalled connections from %s: a member connected, every peer locked", port.name, len(flood), src.name)
			transporttest.CloseAll(flood)
		}
	}
}
