package faultnet

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// originWait bounds how long an accepted gossip stream waits for its dialer
// to register which peer it came from: the dialer records the connection's
// local address only once the dial returns, which can be just after the
// listener accepted it.
const originWait = 100 * time.Millisecond

// GossipTransport wraps a memberlist transport (normally a
// memberlist.NetTransport on loopback) for the peer named self, so that
// gossip obeys the network's rules. peerOf maps a gossip address to a peer
// name ("" for addresses the network does not know, which are never cut).
//
// Packets (UDP) are checked like Raft messages: one sent on a cut or
// dropped link is lost without an error (after the link's Delay
// otherwise), and one received from a peer whose link to self is cut is
// discarded, in case it was in flight when the cut came. Streams (TCP) are
// checked like lockmesh's RPC connections: a dial is refused with ErrCut
// while the link is cut in either direction, an accepted stream from such
// a peer is closed at once, and a live stream breaks as soon as either
// direction is cut.
//
// The returned transport owns inner: its Shutdown shuts inner down.
func (n *Network) GossipTransport(self string, inner memberlist.NodeAwareTransport, peerOf func(gossipAddr string) string) memberlist.NodeAwareTransport {
	t := &gossipTransport{
		NodeAwareTransport: inner,
		net:                n,
		self:               self,
		peerOf:             peerOf,
		packets:            make(chan *memberlist.Packet),
		streams:            make(chan net.Conn),
		stopping:           make(chan struct{}),
		done:               make(chan struct{}),
	}
	t.wg.Add(2)
	go t.forwardPackets()
	go t.forwardStreams()
	return t
}

// gossipTransport embeds inner for FinalAdvertiseAddr.
type gossipTransport struct {
	memberlist.NodeAwareTransport
	net     *Network
	self    string
	peerOf  func(string) string
	packets chan *memberlist.Packet
	streams chan net.Conn

	// stopping closes when Shutdown starts: from then on the forwarders
	// drain inner without delivering, so that inner's listeners, which
	// block on their unbuffered channels, can exit. done closes once
	// inner is down and stops the forwarders.
	stopping     chan struct{}
	done         chan struct{}
	shutdownOnce sync.Once
	wg           sync.WaitGroup // forwarders and accepted streams in flight
}

func (t *gossipTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *gossipTransport) WriteToAddress(b []byte, addr memberlist.Address) (time.Time, error) {
	ok, wait := t.net.transmit(t.self, t.peerOf(addr.Addr))
	if !ok {
		return time.Now(), nil // lost on the wire: the sender cannot tell
	}
	sleep(wait)
	return t.NodeAwareTransport.WriteToAddress(b, addr)
}

func (t *gossipTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *gossipTransport) DialAddressTimeout(addr memberlist.Address, timeout time.Duration) (net.Conn, error) {
	peer := t.peerOf(addr.Addr)
	if ok, _ := t.net.transmit(t.self, peer); !ok || !t.net.Allowed(peer, t.self) {
		return nil, fmt.Errorf("gossip dial %s (%s -> %s): %w", addr.Addr, t.self, peer, ErrCut)
	}
	raw, err := t.NodeAwareTransport.DialAddressTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	c := &conn{Conn: raw, net: t.net, self: t.self, peer: peer, origin: raw.LocalAddr().String()}
	if !t.net.track(c) {
		_ = raw.Close()
		return nil, fmt.Errorf("gossip dial %s (%s -> %s): %w", addr.Addr, t.self, peer, ErrCut)
	}
	return c, nil
}

func (t *gossipTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *gossipTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown shuts inner down and stops the forwarders. It is idempotent.
func (t *gossipTransport) Shutdown() error {
	var err error
	t.shutdownOnce.Do(func() {
		close(t.stopping)
		err = t.NodeAwareTransport.Shutdown()
		close(t.done)
		t.wg.Wait()
	})
	return err
}

func (t *gossipTransport) forwardPackets() {
	defer t.wg.Done()
	in := t.NodeAwareTransport.PacketCh()
	for {
		select {
		case <-t.done:
			return
		case p := <-in:
			if p.From != nil && !t.net.Allowed(t.peerOf(p.From.String()), t.self) {
				continue
			}
			select {
			case t.packets <- p:
			case <-t.stopping:
			}
		}
	}
}

func (t *gossipTransport) forwardStreams() {
	defer t.wg.Done()
	in := t.NodeAwareTransport.StreamCh()
	for {
		select {
		case <-t.done:
			return
		case raw := <-in:
			// Naming the dialer may wait for it to register: do not hold
			// up other streams meanwhile.
			t.wg.Add(1)
			go t.accept(raw)
		}
	}
}

// accept hands an incoming stream to memberlist unless its link is cut.
func (t *gossipTransport) accept(raw net.Conn) {
	defer t.wg.Done()
	peer, ok := t.net.originOf(raw.RemoteAddr().String(), originWait, t.stopping)
	if !ok {
		// Not dialed through a faultnet transport: the remote address may
		// still be a gossip address the caller knows.
		peer = t.peerOf(raw.RemoteAddr().String())
	}
	c := &conn{Conn: raw, net: t.net, self: t.self, peer: peer}
	if !t.net.track(c) {
		_ = raw.Close()
		return
	}
	select {
	case t.streams <- c:
	case <-t.stopping:
		_ = c.Close()
	}
}

var _ memberlist.NodeAwareTransport = (*gossipTransport)(nil)
