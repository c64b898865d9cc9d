package faultnet

import (
	"context"
	"fmt"

	"github.com/lni/dragonboat/v4/config"
	chantransport "github.com/lni/dragonboat/v4/plugin/chan"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"
)

// RaftTransportFactory returns a dragonboat transport factory for the peer
// named self: dragonboat's in-memory channel transport (addresses are plain
// strings looked up in a process-wide table keyed by
// NodeHostConfig.RaftAddress; nothing listens on a port) with this
// network's rules applied to everything self sends. peerOf maps a Raft
// address to a peer name; it is called on every connection and may change
// as peers restart.
//
// A message batch on a cut or dropped link is silently lost, as a network
// would lose it; a snapshot chunk on a cut link fails with ErrCut so that
// dragonboat retries the snapshot later.
func (n *Network) RaftTransportFactory(self string, peerOf func(raftAddr string) string) config.TransportFactory {
	return &raftFactory{net: n, self: self, peerOf: peerOf}
}

type raftFactory struct {
	net    *Network
	self   string
	peerOf func(string) string
	inner  chantransport.ChanTransportFactory
}

func (f *raftFactory) Create(nhc config.NodeHostConfig, h raftio.MessageHandler, ch raftio.ChunkHandler) raftio.ITransport {
	return &raftTransport{ITransport: f.inner.Create(nhc, h, ch), f: f}
}

// Validate accepts any address: the channel transport needs no real host
// or port.
func (f *raftFactory) Validate(string) bool { return true }

type raftTransport struct {
	raftio.ITransport
	f *raftFactory
}

func (t *raftTransport) Name() string { return "faultnet/" + t.ITransport.Name() }

func (t *raftTransport) GetConnection(ctx context.Context, target string) (raftio.IConnection, error) {
	c, err := t.ITransport.GetConnection(ctx, target)
	if err != nil {
		return nil, err
	}
	return &raftConn{IConnection: c, net: t.f.net, self: t.f.self, peer: t.f.peerOf(target)}, nil
}

func (t *raftTransport) GetSnapshotConnection(ctx context.Context, target string) (raftio.ISnapshotConnection, error) {
	c, err := t.ITransport.GetSnapshotConnection(ctx, target)
	if err != nil {
		return nil, err
	}
	return &snapshotConn{ISnapshotConnection: c, net: t.f.net, self: t.f.self, peer: t.f.peerOf(target)}, nil
}

type raftConn struct {
	raftio.IConnection
	net        *Network
	self, peer string
}

func (c *raftConn) SendMessageBatch(batch pb.MessageBatch) error {
	ok, wait := c.net.transmit(c.self, c.peer)
	if !ok {
		return nil // lost on the wire: the sender cannot tell
	}
	sleep(wait)
	return c.IConnection.SendMessageBatch(batch)
}

type snapshotConn struct {
	raftio.ISnapshotConnection
	net        *Network
	self, peer string
}

func (c *snapshotConn) SendChunk(chunk pb.Chunk) error {
	ok, wait := c.net.transmit(c.self, c.peer)
	if !ok {
		return fmt.Errorf("snapshot chunk %s -> %s: %w", c.self, c.peer, ErrCut)
	}
	sleep(wait)
	if err := c.ISnapshotConnection.SendChunk(chunk); err != nil {
		return err
	}
	c.net.countChunk(c.self, c.peer)
	return nil
}
