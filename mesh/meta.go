package mesh

import (
	"bytes"
	"fmt"

	"github.com/hashicorp/memberlist"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/lockmesh/lockmesh/internal/level"
)

const (
	// MaxMetaSize is the largest encoded [Meta], memberlist's own limit on
	// node metadata.
	MaxMetaSize = memberlist.MetaMaxSize

	// MaxMetaStringLen bounds each string field of [Meta]; it is longer
	// than any DNS name or UUID.
	MaxMetaStringLen = 255

	// metaFormatV1 is the first byte of every encoded Meta. Fields may be
	// appended to the array without a new format version: older decoders
	// skip what they do not know.
	metaFormatV1 byte = 1

	// metaFields is the number of array elements format 1 defines.
	metaFields = 5

	// maxMetaArrayLen caps the array header so garbage cannot make the
	// decoder loop over billions of claimed elements.
	maxMetaArrayLen = 64
)

// Meta is what each peer gossips about itself. It is encoded by [EncodeMeta]
// into at most [MaxMetaSize] bytes: a format version byte followed by a
// msgpack array of the fields in declaration order.
type Meta struct {
	// NodeHostID is the peer's dragonboat NodeHostID (a UUID string). Raft
	// targets are NodeHostIDs, and the [Registry] resolves them to RaftAddr.
	NodeHostID string
	// RaftAddr is the host:port of the peer's dragonboat transport.
	RaftAddr string
	// RPCAddr is the host:port of the peer's lockmesh transport.
	RPCAddr string
	// MaxLevel is the newest feature level (internal/level) the peer
	// speaks. A peer from before levels gossips 1 here.
	MaxLevel level.Level
	// NoReplicas marks a peer that never hosts replicas (a client-only
	// peer): it forwards its requests to peers that do. Optional sixth
	// field; peers that predate it read it as false.
	NoReplicas bool
	// JoinOnly marks a peer that only joins a cluster that exists (node's
	// BootstrapExpect 0): peers forming a new cluster neither count it
	// nor wait for it to coordinate. Optional seventh field; peers that
	// predate it read it as false.
	JoinOnly bool
	// Cluster is 0 until the peer belongs to a bootstrapped cluster, then
	// that cluster's id.
	Cluster uint64
	// MinLevel is the oldest feature level the peer still speaks: it
	// speaks every level from MinLevel to MaxLevel. Optional eighth field;
	// a peer that predates it speaks only its MaxLevel, and its Meta
	// decodes with MinLevel equal to MaxLevel.
	MinLevel level.Level
}

// Levels returns the range of feature levels m speaks, lo to hi.
func (m Meta) Levels() (lo, hi level.Level) {
	lo = m.MinLevel
	if lo == 0 || lo > m.MaxLevel {
		lo = m.MaxLevel
	}
	return lo, m.MaxLevel
}

// EncodeMeta encodes m for gossip. It fails with [ErrMetaTooLarge] when a
// string field is longer than [MaxMetaStringLen] or the result would exceed
// [MaxMetaSize]. The encoding is deterministic: equal Metas give equal bytes.
func EncodeMeta(m Meta) ([]byte, error) {
	for _, f := range []struct{ name, v string }{
		{"NodeHostID", m.NodeHostID},
		{"RaftAddr", m.RaftAddr},
		{"RPCAddr", m.RPCAddr},
	} {
		if len(f.v) > MaxMetaStringLen {
			return nil, fmt.Errorf("%w: %s is %d bytes, limit %d",
				ErrMetaTooLarge, f.name, len(f.v), MaxMetaStringLen)
		}
	}
	var buf bytes.Buffer
	buf.WriteByte(metaFormatV1)
	enc := msgpack.NewEncoder(&buf)
	// Writes to a bytes.Buffer cannot fail, so the errors are dropped.
	_ = enc.EncodeArrayLen(metaFields + 3)
	_ = enc.EncodeString(m.NodeHostID)
	_ = enc.EncodeString(m.RaftAddr)
	_ = enc.EncodeString(m.RPCAddr)
	_ = enc.EncodeUint(uint64(m.MaxLevel))
	_ = enc.EncodeUint(m.Cluster)
	_ = enc.EncodeBool(m.NoReplicas)
	_ = enc.EncodeBool(m.JoinOnly)
	_ = enc.EncodeUint(uint64(m.MinLevel))
	if buf.Len() > MaxMetaSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrMetaTooLarge, buf.Len(), MaxMetaSize)
	}
	return buf.Bytes(), nil
}

// DecodeMeta decodes what [EncodeMeta] produced. It is safe on untrusted
// input: it never panics, rejects input longer than [MaxMetaSize]
// ([ErrMetaTooLarge]) and anything malformed ([ErrBadMeta]) before
// allocating more than the input size. Array elements after the known
// fields are skipped, so newer peers may append fields.
func DecodeMeta(b []byte) (Meta, error) {
	if len(b) > MaxMetaSize {
		return Meta{}, fmt.Errorf("%w: %d bytes, limit %d", ErrMetaTooLarge, len(b), MaxMetaSize)
	}
	if len(b) == 0 {
		return Meta{}, fmt.Errorf("%w: empty", ErrBadMeta)
	}
	if b[0] != metaFormatV1 {
		return Meta{}, fmt.Errorf("%w: format version %d, this peer understands %d (upgrade it)",
			ErrBadMeta, b[0], metaFormatV1)
	}
	r := bytes.NewReader(b[1:])
	dec := msgpack.NewDecoder(r)
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return Meta{}, fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	if n < metaFields || n > maxMetaArrayLen {
		return Meta{}, fmt.Errorf("%w: %d fields, want %d to %d", ErrBadMeta, n, metaFields, maxMetaArrayLen)
	}
	var m Meta
	if m.NodeHostID, err = decodeMetaString(dec); err != nil {
		return Meta{}, fmt.Errorf("%w: NodeHostID: %v", ErrBadMeta, err)
	}
	if m.RaftAddr, err = decodeMetaString(dec); err != nil {
		return Meta{}, fmt.Errorf("%w: RaftAddr: %v", ErrBadMeta, err)
	}
	if m.RPCAddr, err = decodeMetaString(dec); err != nil {
		return Meta{}, fmt.Errorf("%w: RPCAddr: %v", ErrBadMeta, err)
	}
	v, err := decodeMetaUint(dec)
	if err != nil || v > 0xff {
		return Meta{}, fmt.Errorf("%w: MaxLevel: %v (value %d)", ErrBadMeta, err, v)
	}
	m.MaxLevel = level.Level(v)
	if m.Cluster, err = decodeMetaUint(dec); err != nil {
		return Meta{}, fmt.Errorf("%w: Cluster: %v", ErrBadMeta, err)
	}
	known := metaFields
	if n > metaFields {
		if m.NoReplicas, err = dec.DecodeBool(); err != nil {
			return Meta{}, fmt.Errorf("%w: NoReplicas: %v", ErrBadMeta, err)
		}
		known++
	}
	if n > metaFields+1 {
		if m.JoinOnly, err = dec.DecodeBool(); err != nil {
			return Meta{}, fmt.Errorf("%w: JoinOnly: %v", ErrBadMeta, err)
		}
		known++
	}
	m.MinLevel = m.MaxLevel
	if n > metaFields+2 {
		v, err := decodeMetaUint(dec)
		if err != nil || v > 0xff {
			return Meta{}, fmt.Errorf("%w: MinLevel: %v (value %d)", ErrBadMeta, err, v)
		}
		m.MinLevel = level.Level(v)
		known++
	}
	for i := known; i < n; i++ {
		// Each skipped element consumes at least one byte, and the input
		// is at most MaxMetaSize, so this ends quickly on garbage.
		if err := dec.Skip(); err != nil {
			return Meta{}, fmt.Errorf("%w: field %d: %v", ErrBadMeta, i, err)
		}
	}
	if r.Len() != 0 {
		return Meta{}, fmt.Errorf("%w: %d trailing bytes", ErrBadMeta, r.Len())
	}
	return m, nil
}

// decodeMetaString accepts only the string encodings that can hold
// MaxMetaStringLen bytes (fixstr, str8), so a forged length can never make
// msgpack allocate more than 255 bytes.
func decodeMetaString(dec *msgpack.Decoder) (string, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsFixedString(c) && c != msgpcode.Str8 {
		return "", fmt.Errorf("msgpack code %#x is not a short string", c)
	}
	return dec.DecodeString()
}

// decodeMetaUint accepts only unsigned integer encodings, so a negative
// number is an error rather than a huge value.
func decodeMetaUint(dec *msgpack.Decoder) (uint64, error) {
	c, err := dec.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c <= msgpcode.PosFixedNumHigh,
		c == msgpcode.Uint8, c == msgpcode.Uint16, c == msgpcode.Uint32, c == msgpcode.Uint64:
		return dec.DecodeUint64()
	default:
		return 0, fmt.Errorf("msgpack code %#x is not an unsigned integer", c)
	}
}
