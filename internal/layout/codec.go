package layout

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/msgcheck"
)

// version is the first byte of an encoded layout. Data dirs and meta-shard
// logs hold layouts encoded with it, so it stays 1 for as long as Decode
// reads them.
const version = 1

// maxEncodedSize bounds the layout Decode accepts, as node bounds every
// RPC body.
const maxEncodedSize = 4 << 20

// Encode returns p as stored in the meta shard and the data dir: the
// version byte, then p in msgpack under its field tags. The encoding is
// canonical (the replica map sorted by shard), so equal layouts encode to
// equal bytes on every peer. Encode does not validate p.
func Encode(p *Placement) ([]byte, error) {
	b, err := msgpack.Marshal(wire{
		Epoch: p.Epoch, ClusterID: p.ClusterID, Shards: p.Shards, RF: p.RF, Peers: p.Peers,
		Replicas: sortedReplicas(p.Replicas), NextReplicaID: p.NextReplicaID, KeyScheme: p.KeyScheme, Level: p.Level,
	})
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	return append([]byte{version}, b...), nil
}

// wire is a Placement as Encode writes it: the same fields in the same
// order under the same tags, so that it encodes as the Placement struct
// itself does (which Decode reads), except that the replica map is sorted.
// msgpack's SetSortMapKeys sorts only string keys.
type wire struct {
	Epoch         uint64         `msgpack:"e"`
	ClusterID     uint64         `msgpack:"c"`
	Shards        int            `msgpack:"s"`
	RF            int            `msgpack:"f"`
	Peers         []Peer         `msgpack:"p"`
	Replicas      sortedReplicas `msgpack:"x"`
	NextReplicaID uint64         `msgpack:"n"`
	KeyScheme     uint8          `msgpack:"k,omitempty"`
	Level         uint32         `msgpack:"l,omitempty"`
}

// sortedReplicas encodes as msgpack encodes a map[uint64][]Replica, with
// the keys in increasing order.
type sortedReplicas map[uint64][]Replica

// EncodeMsgpack implements msgpack.CustomEncoder.
func (m sortedReplicas) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, shard := range slices.Sorted(maps.Keys(m)) {
		if err := e.EncodeUint64(shard); err != nil {
			return err
		}
		if err := e.Encode(m[shard]); err != nil {
			return err
		}
	}
	return nil
}

// Decode reads a layout written by Encode, of this version or an earlier
// one, and returns it only if it is valid: an unknown version byte, more
// than 4 MiB, bytes that are not a layout, or a layout that fails
// validation (no cluster id, shards out of range, no peers, a key scheme
// this version does not know, a shard without replicas or with a replica
// on an unlisted peer or under an id not given out yet) is an error.
// Decode never panics, whatever b holds, and allocates in proportion to
// len(b).
func Decode(b []byte) (*Placement, error) {
	if len(b) == 0 {
		return nil, errors.New("placement: unknown version: empty")
	}
	if b[0] != version {
		return nil, fmt.Errorf("placement: unknown version %d, this release reads %d (written by a newer release? upgrade this peer)", b[0], version)
	}
	if len(b) > maxEncodedSize {
		return nil, fmt.Errorf("placement: %d bytes is too large", len(b))
	}
	if err := msgcheck.Shape(b[1:]); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	p := &Placement{}
	if err := msgpack.Unmarshal(b[1:], p); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	return p, nil
}
