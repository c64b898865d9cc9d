package replicas

import (
	"context"

	"github.com/lni/dragonboat/v4/config"
	"github.com/lni/dragonboat/v4/raftio"
	pb "github.com/lni/dragonboat/v4/raftpb"

	"github.com/lockmesh/lockmesh/internal/authz"
	"github.com/lockmesh/lockmesh/internal/raftauth"
)

// RaftPeers is what the filter in front of the Raft port
// (internal/raftauth) asks the peer that the replica table cannot
// answer. Its methods are called on transport goroutines, concurrently,
// and must not block for long.
type RaftPeers interface {
	// Host returns the name and NodeHostID of the member the layout
	// places replica of shard on.
	Host(shard, replica uint64) (name, nodeHostID string, ok bool)
	// Proposal decides whether c may propose payload on shard
	// (raftauth.View.Proposal).
	Proposal(c authz.Caller, shard uint64, payload []byte) error
}

// gateView is the raftauth.View of a peer: its running replicas, and the
// rest from its RaftPeers.
type gateView struct {
	*Table
	RaftPeers
}

var _ raftauth.View = gateView{}

// gatedFactory puts gate in front of a transport that is not raftnet
// (tests inject an in-memory one): the batches it delivers pass the gate
// as from an anonymous sender, and the batches sent are noted.
type gatedFactory struct {
	config.TransportFactory
	gate *raftauth.Filter
}

func (f gatedFactory) Create(nhc config.NodeHostConfig, onBatch raftio.MessageHandler, onChunk raftio.ChunkHandler) raftio.ITransport {
	batch := func(b pb.MessageBatch) {
		f.gate.Batch(nil, &b) // refusals are counted (Table.RaftRefused)
		if len(b.Requests) > 0 {
			onBatch(b)
		}
	}
	chunk := func(c pb.Chunk) bool {
		return f.gate.Chunk(nil, &c) == nil && onChunk(c)
	}
	return gatedTransport{ITransport: f.TransportFactory.Create(nhc, batch, chunk), gate: f.gate}
}

type gatedTransport struct {
	raftio.ITransport
	gate *raftauth.Filter
}

func (t gatedTransport) GetConnection(ctx context.Context, target string) (raftio.IConnection, error) {
	c, err := t.ITransport.GetConnection(ctx, target)
	if err != nil {
		return nil, err
	}
	return gatedConn{IConnection: c, gate: t.gate}, nil
}

type gatedConn struct {
	raftio.IConnection
	gate *raftauth.Filter
}

func (c gatedConn) SendMessageBatch(b pb.MessageBatch) error {
	c.gate.Sent(&b)
	return c.IConnection.SendMessageBatch(b)
}
