// Package faultnet is an in-process network with fault rules between named
// peers, for tests: partitions (two-way and one-way), isolation, delays and
// random drops. Adapters put it under dragonboat's Raft transport (on top of
// the in-memory channel transport), under lockmesh's own RPC transport (on
// top of loopback TCP) and under memberlist's gossip transport (loopback UDP
// and TCP).
//
// Rules are directional: a link from A to B is cut when a rule cuts A->B or
// either end is isolated. Raft messages and gossip packets are checked by
// the sender for its outgoing link; a TCP connection is broken as soon as
// either direction of its link is cut, because a stream cannot carry
// requests one way only.
package faultnet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// ErrCut is returned by dials and connection reads and writes on a link the
// network has cut.
var ErrCut = errors.New("faultnet: link cut")

type link struct{ from, to string }

// Network holds the fault rules between named peers. The zero value is not
// usable; call New. A Network is safe for concurrent use.
type Network struct {
	mu       sync.Mutex
	cut      map[link]bool
	isolated map[string]bool
	delay    map[link]time.Duration
	drop     map[link]float64
	conns    map[*conn]struct{} // live TCP connections, broken when their link is cut
	chunks   map[link]int       // snapshot chunks delivered per link, never reset
	// origins names the peer that dialed each live gossip stream, by the
	// stream's local address, so the accepting side can tell who it is;
	// originAdded is closed (and replaced) whenever one is added.
	origins     map[string]string
	originAdded chan struct{}
}

// New returns a healthy network: every link allowed, no delay, no drops.
func New() *Network {
	n := &Network{conns: map[*conn]struct{}{}, chunks: map[link]int{},
		origins: map[string]string{}, originAdded: make(chan struct{})}
	n.reset()
	return n
}

func (n *Network) reset() {
	n.cut = map[link]bool{}
	n.isolated = map[string]bool{}
	n.delay = map[link]time.Duration{}
	n.drop = map[link]float64{}
}

// Partition cuts every link between a peer of groupA and a peer of groupB,
// in both directions. Links inside each group are untouched.
func (n *Network) Partition(groupA, groupB []string) {
	n.change(func() {
		for _, a := range groupA {
			for _, b := range groupB {
				n.cut[link{a, b}] = true
				n.cut[link{b, a}] = true
			}
		}
	})
}

// OneWay cuts the link from one peer to another; the reverse direction is
// untouched.
func (n *Network) OneWay(from, to string) {
	n.change(func() { n.cut[link{from, to}] = true })
}

// Isolate cuts every link to and from name.
func (n *Network) Isolate(name string) {
	n.change(func() { n.isolated[name] = true })
}

// Rejoin undoes Isolate for name; other rules stay.
func (n *Network) Rejoin(name string) {
	n.change(func() { delete(n.isolated, name) })
}

// Delay makes every message (or TCP write) from one peer to another wait d
// before it is sent. Zero removes the delay.
func (n *Network) Delay(from, to string, d time.Duration) {
	n.change(func() {
		if d <= 0 {
			delete(n.delay, link{from, to})
		} else {
			n.delay[link{from, to}] = d
		}
	})
}

// DropRate makes messages from one peer to another get lost with
// probability p (0 to 1). On TCP links, where bytes cannot be lost without
// corrupting the stream, a dial is refused and a write breaks the
// connection with probability p instead.
func (n *Network) DropRate(from, to string, p float64) {
	n.change(func() {
		if p <= 0 {
			delete(n.drop, link{from, to})
		} else {
			n.drop[link{from, to}] = min(p, 1)
		}
	})
}

// Heal removes every rule: no cuts, isolations, delays or drops.
func (n *Network) Heal() {
	n.change(n.reset)
}

// Allowed reports whether the link from one peer to another is up. Peers
// with an empty name (addresses the network does not know) are always
// allowed.
func (n *Network) Allowed(from, to string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.allowedLocked(from, to)
}

func (n *Network) allowedLocked(from, to string) bool {
	if from == "" || to == "" || from == to {
		return true
	}
	return !n.cut[link{from, to}] && !n.isolated[from] && !n.isolated[to]
}

// track registers a new TCP connection so that a cut breaks it, and
// reports false (registering nothing) when its link is already cut either
// way.
func (n *Network) track(c *conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.allowedLocked(c.self, c.peer) || !n.allowedLocked(c.peer, c.self) {
		return false
	}
	n.conns[c] = struct{}{}
	if c.origin != "" {
		n.addOriginLocked(c.origin, c.self)
	}
	return true
}

// addOriginLocked records that peer dialed the stream whose local address
// is addr and wakes originOf. Callers hold n.mu.
func (n *Network) addOriginLocked(addr, peer string) {
	n.origins[addr] = peer
	close(n.originAdded)
	n.originAdded = make(chan struct{})
}

// originOf names the peer that dialed the stream whose far end is addr,
// waiting up to wait (or until done closes) for the dialer to register it.
func (n *Network) originOf(addr string, wait time.Duration, done <-chan struct{}) (string, bool) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		n.mu.Lock()
		peer, ok := n.origins[addr]
		added := n.originAdded
		n.mu.Unlock()
		if ok {
			return peer, true
		}
		select {
		case <-added:
		case <-timer.C:
			return "", false
		case <-done:
			return "", false
		}
	}
}

// SnapshotChunks counts the Raft snapshot chunks delivered from one peer to
// another since the network was created, so a test can tell a replica
// caught up from a snapshot rather than from the log.
func (n *Network) SnapshotChunks(from, to string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.chunks[link{from, to}]
}

func (n *Network) countChunk(from, to string) {
	n.mu.Lock()
	n.chunks[link{from, to}]++
	n.mu.Unlock()
}

// String describes the current rules, for test logs.
func (n *Network) String() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fmt.Sprintf("cut=%v isolated=%v delay=%v drop=%v", n.cut, n.isolated, n.delay, n.drop)
}

// transmit decides the fate of one message from one peer to another: ok is
// false when it must be lost, wait is how long to hold it first.
func (n *Network) transmit(from, to string) (ok bool, wait time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.allowedLocked(from, to) {
		return false, 0
	}
	if p := n.drop[link{from, to}]; p > 0 && rand.Float64() < p {
		return false, 0
	}
	return true, n.delay[link{from, to}]
}

// change applies a rule change and breaks the TCP connections it cuts.
func (n *Network) change(f func()) {
	n.mu.Lock()
	f()
	var broken []*conn
	for c := range n.conns {
		if !n.allowedLocked(c.self, c.peer) || !n.allowedLocked(c.peer, c.self) {
			broken = append(broken, c)
			delete(n.conns, c)
		}
	}
	n.mu.Unlock()
	for _, c := range broken {
		_ = c.Close()
	}
}

// sleep waits d; it exists so that zero delays cost nothing.
func sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

var _ net.Conn = (*conn)(nil)
