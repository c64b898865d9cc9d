package layout

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
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
	if len(b) == 0 || b[0] != version {
		return nil, errors.New("placement: unknown version")
	}
	if len(b) > maxEncodedSize {
		return nil, fmt.Errorf("placement: %d bytes is too large", len(b))
	}
	if err := checkShape(b[1:]); err != nil {
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

// maxDepth bounds how deeply checkShape lets msgpack containers nest. A
// layout nests four deep (layout, replica map, replica list, replica);
// the rest is room for fields a later version may add.
const maxDepth = 32

// checkShape checks that b starts with one whole msgpack value whose
// arrays and maps claim no more elements than bytes remain (each element
// takes at least one) and nest at most maxDepth deep. msgpack v5.4.1 makes
// a slice as long as an array claims before it reads an element (its
// allocation limit never applies: decode_slice.go tests the flag against
// 1), so nine bytes claiming 4G peers would ask for 160 GB and kill the
// process. After this check what Decode allocates is bounded by a small
// multiple of len(b), and msgpack's recursion by maxDepth.
func checkShape(b []byte) error {
	truncated := errors.New("truncated msgpack value")
	pending := []int{1} // values still to read at each open level
	i := 0
	// size reads the big-endian length of w bytes at i.
	size := func(w int) (uint64, error) {
		if w > len(b)-i {
			return 0, truncated
		}
		var n uint64
		for _, c := range b[i : i+w] {
			n = n<<8 | uint64(c)
		}
		i += w
		return n, nil
	}
	for len(pending) > 0 {
		top := len(pending) - 1
		if pending[top] == 0 {
			pending = pending[:top]
			continue
		}
		pending[top]--
		if i >= len(b) {
			return truncated
		}
		c := b[i]
		i++
		var elems, skip uint64 // elems of a container; skip bytes of payload
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			// fixint, nil, false, true: the code is the value
		case c >= 0x80 && c <= 0x8f:
			elems = 2 * uint64(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			elems = uint64(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, err = size(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			skip, err = size(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			skip, err = size(4)
		case c == 0xc7: // ext8: length, type, data
			skip, err = size(1)
			skip++
		case c == 0xc8: // ext16
			skip, err = size(2)
			skip++
		case c == 0xc9: // ext32
			skip, err = size(4)
			skip++
		case c == 0xcc || c == 0xd0:
			skip = 1
		case c == 0xcd || c == 0xd1:
			skip = 2
		case c == 0xca || c == 0xce || c == 0xd2:
			skip = 4
		case c == 0xcb || c == 0xcf || c == 0xd3:
			skip = 8
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc:
			elems, err = size(2)
		case c == 0xdd:
			elems, err = size(4)
		case c == 0xde:
			elems, err = size(2)
			elems *= 2
		case c == 0xdf:
			elems, err = size(4)
			elems *= 2
		default:
			return fmt.Errorf("invalid msgpack code %#x", c)
		}
		if err != nil {
			return err
		}
		if skip > uint64(len(b)-i) {
			return truncated
		}
		i += int(skip)
		if elems > 0 {
			if elems > uint64(len(b)-i) {
				return fmt.Errorf("a msgpack container claims %d elements in %d bytes", elems, len(b)-i)
			}
			if len(pending) > maxDepth {
				return fmt.Errorf("msgpack containers nest deeper than %d", maxDepth)
			}
			pending = append(pending, int(elems))
		}
	}
	return nil
}
