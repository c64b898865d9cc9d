package faultnet

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Dialer returns a dial function (for lockmesh's transport.Config.Dial) for
// the peer named self. peerOf maps a dialed address to a peer name ("" for
// addresses the network does not know, which are never cut).
//
// A dial is refused with ErrCut while the link is cut in either direction.
// The connection it returns breaks (reads and writes fail with ErrCut and
// the socket is closed, so the far end sees it too) as soon as either
// direction is cut, and every write from self waits the link's Delay.
func (n *Network) Dialer(self string, peerOf func(addr string) string) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		peer := peerOf(addr)
		if ok, _ := n.transmit(self, peer); !ok || !n.Allowed(peer, self) {
			return nil, fmt.Errorf("dial %s (%s -> %s): %w", addr, self, peer, ErrCut)
		}
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		c := &conn{Conn: raw, net: n, self: self, peer: peer}
		if !n.track(c) {
			_ = raw.Close()
			return nil, fmt.Errorf("dial %s (%s -> %s): %w", addr, self, peer, ErrCut)
		}
		return c, nil
	}
}

// conn is a TCP connection under the network's rules.
type conn struct {
	net.Conn
	net        *Network
	self, peer string
	// origin is the local address of a gossip stream self dialed, by
	// which the accepting side names self; empty for other connections.
	origin    string
	closeOnce sync.Once
}

// check fails once the link is cut either way, closing the socket.
func (c *conn) check() error {
	if c.net.Allowed(c.self, c.peer) && c.net.Allowed(c.peer, c.self) {
		return nil
	}
	_ = c.Close()
	return fmt.Errorf("%s <-> %s: %w", c.self, c.peer, ErrCut)
}

func (c *conn) Read(b []byte) (int, error) {
	if err := c.check(); err != nil {
		return 0, err
	}
	k, err := c.Conn.Read(b)
	if err == nil {
		if cerr := c.check(); cerr != nil {
			// The bytes arrived after the cut: a real network would have lost them.
			return 0, cerr
		}
	}
	return k, err
}

func (c *conn) Write(b []byte) (int, error) {
	ok, wait := c.net.transmit(c.self, c.peer)
	if !ok {
		_ = c.Close()
		return 0, fmt.Errorf("%s -> %s: %w", c.self, c.peer, ErrCut)
	}
	sleep(wait)
	if err := c.check(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

func (c *conn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.net.mu.Lock()
		delete(c.net.conns, c)
		if c.origin != "" {
			delete(c.net.origins, c.origin)
		}
		c.net.mu.Unlock()
		err = c.Conn.Close()
	})
	return err
}
