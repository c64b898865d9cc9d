package lockfsm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
)

// Wire format. Every encoding is one version byte followed by one msgpack
// value in canonical form: unsigned ints, string, array and map lengths in
// their shortest encoding, booleans as true/false.
//
//	commands, FormatTagged (3):     [ {tag: value, ...}, ... ]
//	commands, FormatPositional (2): [ [op, session, req, ack, key, wait, limit, target, owner, ttlMillis, term], ... ]
//	results, version 2:             [ [status, session, token, err], ... ]
//	results, version 3:             [ [status, session, token, err, holders], ... ]
//	  holder:                       [session, req, token, owner, label, kind, permits]
//
// A tagged command is a map whose keys are the field tags below in
// ascending order, each present only when its value is not zero (Op is
// never zero). Version 1 commands are positional without term (10 fields)
// and decode with Term 0; results are the same in versions 1 and 2, and
// version 3, written only for a batch where a refusal names holders (an
// answer to a command of feature level 3), adds the holders. The
// decoders accept exactly these forms, so decoding a current-version input
// then encoding it gives the input back byte for byte, and they check every
// length against the input that is left before allocating.

const (
	commandFields      = 11
	commandFieldsV1    = 10
	resultFields       = 4
	resultFieldsV3     = 5
	holderDetailFields = 7
)

// Field tags of FormatTagged. A tag is never reused for another meaning; a
// new field takes the next free tag.
const (
	tagOp = iota + 1
	tagSession
	tagReq
	tagAck
	tagKey
	tagWait
	tagLimit
	tagTarget
	tagOwner
	tagTTL
	tagTerm
	tagLabel // feature level 3, as are the tags below
	tagKind
	tagPermits
	tagGroup
	tagFlags
	tagMaxHold
	tagCapped
	tagValue // feature level 4, as is the tag below
	tagPriority
	maxTag = tagPriority
)

// EncodeCommands encodes a batch for one Raft entry in the newest format,
// Version. It fails if the batch is empty or larger than MaxBatch, a key or
// owner is longer than its limit, or the encoding exceeds MaxEntrySize:
// whatever it returns decodes.
func EncodeCommands(cmds []Command) ([]byte, error) {
	return EncodeCommandsFormat(Version, cmds)
}

// EncodeCommandsFormat encodes a batch in the given command format,
// FormatPositional or FormatTagged: a cluster writes the format its feature
// level allows, so that every replica can read it. It fails as
// EncodeCommands does, and for any other format.
func EncodeCommandsFormat(format byte, cmds []Command) ([]byte, error) {
	if format != FormatPositional && format != FormatTagged {
		return nil, fmt.Errorf("lockfsm: encode commands: %w: format %d, want %d or %d", ErrVersion, format, FormatPositional, FormatTagged)
	}
	if len(cmds) == 0 {
		return nil, fmt.Errorf("lockfsm: encode commands: empty batch")
	}
	if len(cmds) > MaxBatch {
		return nil, fmt.Errorf("lockfsm: encode commands: %d commands, more than MaxBatch %d", len(cmds), MaxBatch)
	}
	var buf bytes.Buffer
	buf.WriteByte(format)
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(len(cmds)) // writes to a bytes.Buffer cannot fail
	for i := range cmds {
		c := &cmds[i]
		if len(c.Key) > MaxKeyLen {
			return nil, fmt.Errorf("lockfsm: encode commands: command %d: key is %d bytes, longer than MaxKeyLen %d", i, len(c.Key), MaxKeyLen)
		}
		if len(c.Owner) > MaxOwnerLen {
			return nil, fmt.Errorf("lockfsm: encode commands: command %d: owner is %d bytes, longer than MaxOwnerLen %d", i, len(c.Owner), MaxOwnerLen)
		}
		if c.Op == 0 || c.Op > maxOp {
			return nil, fmt.Errorf("lockfsm: encode commands: command %d: %w: %v", i, ErrUnsupported, c.Op)
		}
		if format != FormatTagged && c.FeatureLevel() >= 3 {
			return nil, fmt.Errorf("lockfsm: encode commands: command %d: %w: a Label, Kind, Permits, Group, Flags, MaxHoldMillis, Capped or Value needs format %d, not %d", i, ErrUnsupported, FormatTagged, format)
		}
		if len(c.Value) > MaxValueLen {
			return nil, fmt.Errorf("lockfsm: encode commands: command %d: value is %d bytes, longer than MaxValueLen %d", i, len(c.Value), MaxValueLen)
		}
		if format == FormatTagged {
			encodeTagged(e, c)
		} else {
			encodePositional(e, c)
		}
	}
	if buf.Len() > MaxEntrySize {
		return nil, fmt.Errorf("lockfsm: encode commands: %d bytes, more than MaxEntrySize %d", buf.Len(), MaxEntrySize)
	}
	return buf.Bytes(), nil
}

// MinCommandFormat is the oldest command format that can carry cmds:
// FormatTagged when one uses a field or op of level 3 or above (a Label,
// Kind, Permits, Group, Flags, MaxHoldMillis, Capped or Value;
// ExpireHold, SetValue), else FormatPositional. A batch is
// written in at least this format even by a peer whose view of the
// cluster's level still says 1: a Label is set only once level 3 is
// committed (as are the lock family's fields), so every member reads
// FormatTagged.
func MinCommandFormat(cmds []Command) byte {
	for i := range cmds {
		if cmds[i].FeatureLevel() >= 3 {
			return FormatTagged
		}
	}
	return FormatPositional
}

// FeatureLevel is the lowest feature level (internal/level) whose
// replicas all read c: 4 for a Value or a SetValue, 3 for another field
// or op of the lock family (a Label, Kind, Permits, Group, Flags,
// MaxHoldMillis or Capped; ExpireHold), else 1. A peer accepts a command
// only in a cluster at its level or above; only FormatTagged carries
// those of level 3 and above.
func (c *Command) FeatureLevel() uint8 {
	switch {
	case len(c.Value) > 0 || c.Priority != 0 || c.Op >= OpSetValue:
		return 4
	case c.Label != 0 || c.Kind != 0 || c.Permits != 0 || c.Group != 0 || c.Flags != 0 || c.MaxHoldMillis != 0 || c.Capped || c.Op > OpLeaderTerm:
		return 3
	}
	return 1
}

func encodePositional(e *msgpack.Encoder, c *Command) {
	_ = e.EncodeArrayLen(commandFields)
	_ = e.EncodeUint(uint64(c.Op))
	_ = e.EncodeUint(c.Session)
	_ = e.EncodeUint(c.Req)
	_ = e.EncodeUint(c.Ack)
	_ = e.EncodeString(c.Key)
	_ = e.EncodeBool(c.Wait)
	_ = e.EncodeUint(uint64(c.Limit))
	_ = e.EncodeUint(c.Target)
	_ = e.EncodeString(c.Owner)
	_ = e.EncodeUint(c.TTLMillis)
	_ = e.EncodeUint(c.Term)
}

// encodeTagged writes c as a map of its non-zero fields in tag order.
func encodeTagged(e *msgpack.Encoder, c *Command) {
	n := 0
	for _, present := range [...]bool{
		true, c.Session != 0, c.Req != 0, c.Ack != 0, c.Key != "", c.Wait,
		c.Limit != 0, c.Target != 0, c.Owner != "", c.TTLMillis != 0, c.Term != 0, c.Label != 0,
		c.Kind != 0, c.Permits != 0, c.Group != 0, c.Flags != 0, c.MaxHoldMillis != 0, c.Capped,
		len(c.Value) > 0, c.Priority != 0,
	} {
		if present {
			n++
		}
	}
	_ = e.EncodeMapLen(n)
	num := func(tag int, v uint64) {
		if v != 0 {
			_ = e.EncodeUint(uint64(tag))
			_ = e.EncodeUint(v)
		}
	}
	str := func(tag int, v string) {
		if v != "" {
			_ = e.EncodeUint(uint64(tag))
			_ = e.EncodeString(v)
		}
	}
	num(tagOp, uint64(c.Op))
	num(tagSession, c.Session)
	num(tagReq, c.Req)
	num(tagAck, c.Ack)
	str(tagKey, c.Key)
	if c.Wait {
		_ = e.EncodeUint(tagWait)
		_ = e.EncodeBool(true)
	}
	num(tagLimit, uint64(c.Limit))
	num(tagTarget, c.Target)
	str(tagOwner, c.Owner)
	num(tagTTL, c.TTLMillis)
	num(tagTerm, c.Term)
	num(tagLabel, c.Label)
	num(tagKind, uint64(c.Kind))
	num(tagPermits, uint64(c.Permits))
	num(tagGroup, uint64(c.Group))
	num(tagFlags, uint64(c.Flags))
	num(tagMaxHold, c.MaxHoldMillis)
	if c.Capped {
		_ = e.EncodeUint(tagCapped)
		_ = e.EncodeBool(true)
	}
	str(tagValue, string(c.Value))
	num(tagPriority, uint64(c.Priority))
}

// DecodeCommands decodes what EncodeCommands or EncodeCommandsFormat
// produced, in any format from MinVersion to Version. It never panics,
// never allocates more than a small multiple of len(b), and returns an
// error that says where the input is wrong and wraps ErrCorrupt (malformed),
// ErrVersion (a format this release does not read) or ErrUnsupported (an op
// or field tag this release does not know).
func DecodeCommands(b []byte) ([]Command, error) {
	d, err := newDecoder(b, MaxEntrySize, "commands", Version)
	if err != nil {
		return nil, err
	}
	fields := commandFields
	switch d.version {
	case 1:
		fields = commandFieldsV1
	case FormatTagged:
		fields = 1 // each tagged command has at least its op: 3 bytes
	}
	// Each command takes at least fields+1 bytes.
	n, err := d.arrayLen("batch", fields+1)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, d.errorf("empty batch")
	}
	if n > MaxBatch {
		return nil, d.errorf("batch of %d commands, more than MaxBatch %d", n, MaxBatch)
	}
	cmds := make([]Command, n)
	for i := range cmds {
		c := &cmds[i]
		if d.version == FormatTagged {
			d.tagged(c)
		} else {
			d.positional(c, fields)
		}
		if d.err == nil && (c.Op == 0 || c.Op > maxOp) {
			d.err = fmt.Errorf("lockfsm: decode commands: %w: %v, written by a newer release: upgrade this peer", ErrUnsupported, c.Op)
		}
		if d.err == nil && d.version != FormatTagged && c.Op > OpLeaderTerm {
			// The positional formats predate it: nothing writes it there.
			d.fail("op %v in format %d, which only FormatTagged carries", c.Op, d.version)
		}
		if d.err != nil {
			return nil, fmt.Errorf("%w (command %d)", d.err, i)
		}
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return cmds, nil
}

// positional reads a FormatPositional (or version 1) command.
func (d *decoder) positional(c *Command, fields int) {
	_ = d.record("command", fields) // a failure sticks in d.err
	c.Op = Op(d.uint("op", math.MaxUint8))
	c.Session = d.uint("session", math.MaxUint64)
	c.Req = d.uint("req", math.MaxUint64)
	c.Ack = d.uint("ack", math.MaxUint64)
	c.Key = d.str("key", MaxKeyLen)
	c.Wait = d.bool("wait")
	c.Limit = uint32(d.uint("limit", math.MaxUint32))
	c.Target = d.uint("target", math.MaxUint64)
	c.Owner = d.str("owner", MaxOwnerLen)
	c.TTLMillis = d.uint("ttlMillis", math.MaxUint64)
	if fields == commandFields {
		c.Term = d.uint("term", math.MaxUint64)
	}
}

// tagged reads a FormatTagged command: tags strictly ascending, zero values
// absent, every tag known.
func (d *decoder) tagged(c *Command) {
	n := d.mapLen("command", 2)
	last := uint64(0)
	for i := 0; i < n && d.err == nil; i++ {
		tag := d.uint("tag", math.MaxUint64)
		if d.err != nil {
			return
		}
		if tag <= last {
			d.fail("field tag %d after tag %d: tags must ascend", tag, last)
			return
		}
		last = tag
		switch tag {
		case tagOp:
			c.Op = Op(d.nonzero("op", d.uint("op", math.MaxUint8)))
		case tagSession:
			c.Session = d.nonzero("session", d.uint("session", math.MaxUint64))
		case tagReq:
			c.Req = d.nonzero("req", d.uint("req", math.MaxUint64))
		case tagAck:
			c.Ack = d.nonzero("ack", d.uint("ack", math.MaxUint64))
		case tagKey:
			c.Key = d.nonempty("key", d.str("key", MaxKeyLen))
		case tagWait:
			if c.Wait = d.bool("wait"); !c.Wait {
				d.fail("wait: false is written by leaving the field out")
			}
		case tagLimit:
			c.Limit = uint32(d.nonzero("limit", d.uint("limit", math.MaxUint32)))
		case tagTarget:
			c.Target = d.nonzero("target", d.uint("target", math.MaxUint64))
		case tagOwner:
			c.Owner = d.nonempty("owner", d.str("owner", MaxOwnerLen))
		case tagTTL:
			c.TTLMillis = d.nonzero("ttlMillis", d.uint("ttlMillis", math.MaxUint64))
		case tagTerm:
			c.Term = d.nonzero("term", d.uint("term", math.MaxUint64))
		case tagLabel:
			c.Label = d.nonzero("label", d.uint("label", math.MaxUint64))
		case tagKind:
			c.Kind = Kind(d.nonzero("kind", d.uint("kind", math.MaxUint8)))
		case tagPermits:
			c.Permits = uint32(d.nonzero("permits", d.uint("permits", math.MaxUint32)))
		case tagGroup:
			c.Group = uint16(d.nonzero("group", d.uint("group", math.MaxUint16)))
		case tagFlags:
			c.Flags = Flags(d.nonzero("flags", d.uint("flags", math.MaxUint8)))
		case tagMaxHold:
			c.MaxHoldMillis = d.nonzero("maxHoldMillis", d.uint("maxHoldMillis", math.MaxUint64))
		case tagCapped:
			if c.Capped = d.bool("capped"); !c.Capped {
				d.fail("capped: false is written by leaving the field out")
			}
		case tagValue:
			c.Value = []byte(d.nonempty("value", d.str("value", MaxValueLen)))
		case tagPriority:
			c.Priority = uint8(d.nonzero("priority", d.uint("priority", math.MaxUint8)))
		default:
			if d.err == nil {
				d.err = fmt.Errorf("lockfsm: decode commands: %w: field tag %d at byte %d, written by a newer release: upgrade this peer", ErrUnsupported, tag, d.pos)
			}
		}
	}
	if d.err == nil && c.Op == 0 {
		d.fail("command without an op")
	}
}

// nonzero records an error for a zero value written explicitly: the
// canonical form leaves it out.
func (d *decoder) nonzero(field string, v uint64) uint64 {
	if v == 0 {
		d.fail("%s: zero is written by leaving the field out", field)
	}
	return v
}

func (d *decoder) nonempty(field, v string) string {
	if v == "" {
		d.fail("%s: empty is written by leaving the field out", field)
	}
	return v
}

// EncodeResults encodes the results of one entry. It fails if there are more
// than MaxBatch results or an Err is longer than MaxErrLen.
func EncodeResults(rs []Result) ([]byte, error) {
	if len(rs) > MaxBatch {
		return nil, fmt.Errorf("lockfsm: encode results: %d results, more than MaxBatch %d", len(rs), MaxBatch)
	}
	// Version 3 only when a result names holders: those answer commands
	// of feature level 3, whose proposer reads it; every other batch stays
	// in version 2, which every release reads.
	version, fields := byte(2), resultFields
	for i := range rs {
		if len(rs[i].Holders) > 0 {
			version, fields = ResultVersion, resultFieldsV3
		}
	}
	var buf bytes.Buffer
	buf.WriteByte(version)
	e := msgpack.NewEncoder(&buf)
	_ = e.EncodeArrayLen(len(rs))
	for i := range rs {
		r := &rs[i]
		if len(r.Err) > MaxErrLen {
			return nil, fmt.Errorf("lockfsm: encode results: result %d: err is %d bytes, longer than MaxErrLen %d", i, len(r.Err), MaxErrLen)
		}
		if len(r.Holders) > maxDetailHolders {
			return nil, fmt.Errorf("lockfsm: encode results: result %d: %d holders, more than %d", i, len(r.Holders), maxDetailHolders)
		}
		_ = e.EncodeArrayLen(fields)
		_ = e.EncodeUint(uint64(r.Status))
		_ = e.EncodeUint(r.Session)
		_ = e.EncodeUint(r.Token)
		_ = e.EncodeString(r.Err)
		if fields == resultFieldsV3 {
			_ = e.EncodeArrayLen(len(r.Holders))
			for _, h := range r.Holders {
				if len(h.Owner) > MaxOwnerLen {
					return nil, fmt.Errorf("lockfsm: encode results: result %d: holder owner longer than MaxOwnerLen", i)
				}
				_ = e.EncodeArrayLen(holderDetailFields)
				_ = e.EncodeUint(h.Session)
				_ = e.EncodeUint(h.Req)
				_ = e.EncodeUint(h.Token)
				_ = e.EncodeString(h.Owner)
				_ = e.EncodeUint(h.Label)
				_ = e.EncodeUint(uint64(h.Kind))
				_ = e.EncodeUint(uint64(h.Permits))
			}
		}
	}
	return buf.Bytes(), nil
}

// DecodeResults decodes what EncodeResults produced, with the same
// guarantees as DecodeCommands.
func DecodeResults(b []byte) ([]Result, error) {
	d, err := newDecoder(b, MaxEntrySize, "results", ResultVersion)
	if err != nil {
		return nil, err
	}
	fields := resultFields
	if d.version == 3 {
		fields = resultFieldsV3
	}
	n, err := d.arrayLen("batch", fields+1)
	if err != nil {
		return nil, err
	}
	if n > MaxBatch {
		return nil, d.errorf("%d results, more than MaxBatch %d", n, MaxBatch)
	}
	rs := make([]Result, n)
	named := false
	for i := range rs {
		r := &rs[i]
		_ = d.record("result", fields)
		r.Status = Status(d.uint("status", math.MaxUint8))
		r.Session = d.uint("session", math.MaxUint64)
		r.Token = d.uint("token", math.MaxUint64)
		r.Err = d.str("err", MaxErrLen)
		if fields == resultFieldsV3 {
			r.Holders = d.detailHolders()
			named = named || len(r.Holders) > 0
		}
		if d.err != nil {
			return nil, fmt.Errorf("%w (result %d)", d.err, i)
		}
	}
	if fields == resultFieldsV3 && !named {
		return nil, d.errorf("version 3 results that name no holders: those are written as version 2")
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return rs, nil
}

// detailHolders reads a result's holders (version 3): at most
// maxDetailHolders, nil when there are none.
func (d *decoder) detailHolders() []Holder {
	n, err := d.arrayLen("holders", holderDetailFields+1)
	if err != nil || n == 0 {
		return nil
	}
	if n > maxDetailHolders {
		d.fail("%d holders, more than %d", n, maxDetailHolders)
		return nil
	}
	hs := make([]Holder, n)
	for i := range hs {
		h := &hs[i]
		_ = d.record("holder", holderDetailFields)
		h.Session = d.uint("session", math.MaxUint64)
		h.Req = d.uint("req", math.MaxUint64)
		h.Token = d.uint("token", math.MaxUint64)
		h.Owner = d.str("owner", MaxOwnerLen)
		h.Label = d.uint("label", math.MaxUint64)
		h.Kind = Kind(d.uint("kind", math.MaxUint8))
		h.Permits = uint32(d.uint("permits", math.MaxUint32))
	}
	return hs
}

// decoder reads the canonical msgpack subset used here from a byte slice.
// The first error sticks: later reads return zero values, so record
// decoding can read all fields and check d.err once.
type decoder struct {
	b       []byte
	pos     int
	what    string
	version byte // of the input, MinVersion to the decoder's newest
	err     error
}

// newDecoder starts decoding b, whose first byte must be a version from
// MinVersion to newest.
func newDecoder(b []byte, maxSize int, what string, newest byte) (*decoder, error) {
	d := &decoder{b: b, what: what}
	if len(b) > maxSize {
		return nil, d.errorf("input is %d bytes, more than the limit of %d", len(b), maxSize)
	}
	if len(b) == 0 {
		return nil, d.errorf("empty input")
	}
	if b[0] < MinVersion || b[0] > newest {
		return nil, fmt.Errorf("lockfsm: decode %s: %w: got version %d, this release reads %d to %d (written by a newer release? upgrade this peer)", what, ErrVersion, b[0], MinVersion, newest)
	}
	d.version, d.pos = b[0], 1
	return d, nil
}

func (d *decoder) errorf(format string, args ...any) error {
	return fmt.Errorf("lockfsm: decode %s: %w: at byte %d: %s", d.what, ErrCorrupt, d.pos, fmt.Sprintf(format, args...))
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = d.errorf(format, args...)
	}
}

func (d *decoder) remaining() int { return len(d.b) - d.pos }

// take returns the next n bytes, or nil after recording an error.
func (d *decoder) take(field string, n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > d.remaining() {
		d.fail("%s: truncated input: need %d bytes, %d left", field, n, d.remaining())
		return nil
	}
	p := d.b[d.pos : d.pos+n]
	d.pos += n
	return p
}

func (d *decoder) byte1(field string) (byte, bool) {
	p := d.take(field, 1)
	if p == nil {
		return 0, false
	}
	return p[0], true
}

// uint reads a canonical unsigned int no larger than max.
func (d *decoder) uint(field string, max uint64) uint64 {
	c, ok := d.byte1(field)
	if !ok {
		return 0
	}
	var v, min uint64
	switch {
	case c <= 0x7f:
		return d.checkMax(field, uint64(c), max)
	case c == 0xcc:
		p := d.take(field, 1)
		if p == nil {
			return 0
		}
		v, min = uint64(p[0]), 0x80
	case c == 0xcd:
		p := d.take(field, 2)
		if p == nil {
			return 0
		}
		v, min = uint64(binary.BigEndian.Uint16(p)), math.MaxUint8+1
	case c == 0xce:
		p := d.take(field, 4)
		if p == nil {
			return 0
		}
		v, min = uint64(binary.BigEndian.Uint32(p)), math.MaxUint16+1
	case c == 0xcf:
		p := d.take(field, 8)
		if p == nil {
			return 0
		}
		v, min = binary.BigEndian.Uint64(p), math.MaxUint32+1
	default:
		d.fail("%s: want an unsigned integer, got msgpack code 0x%02x", field, c)
		return 0
	}
	if v < min {
		d.fail("%s: integer %d not in its shortest encoding", field, v)
		return 0
	}
	return d.checkMax(field, v, max)
}

func (d *decoder) checkMax(field string, v, max uint64) uint64 {
	if v > max {
		d.fail("%s: %d is out of range (max %d)", field, v, max)
		return 0
	}
	return v
}

func (d *decoder) bool(field string) bool {
	c, ok := d.byte1(field)
	if !ok {
		return false
	}
	switch c {
	case 0xc2:
		return false
	case 0xc3:
		return true
	}
	d.fail("%s: want a boolean, got msgpack code 0x%02x", field, c)
	return false
}

// str reads a canonical string of at most max bytes.
func (d *decoder) str(field string, max int) string {
	c, ok := d.byte1(field)
	if !ok {
		return ""
	}
	var n, min int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9:
		p := d.take(field, 1)
		if p == nil {
			return ""
		}
		n, min = int(p[0]), 32
	case c == 0xda:
		p := d.take(field, 2)
		if p == nil {
			return ""
		}
		n, min = int(binary.BigEndian.Uint16(p)), math.MaxUint8+1
	case c == 0xdb:
		p := d.take(field, 4)
		if p == nil {
			return ""
		}
		n, min = int(binary.BigEndian.Uint32(p)), math.MaxUint16+1
	default:
		d.fail("%s: want a string, got msgpack code 0x%02x", field, c)
		return ""
	}
	if n < min {
		d.fail("%s: string length %d not in its shortest encoding", field, n)
		return ""
	}
	if n > max {
		d.fail("%s: string of %d bytes, longer than the limit of %d", field, n, max)
		return ""
	}
	p := d.take(field, n)
	if p == nil {
		return ""
	}
	return string(p)
}

// arrayLen reads a canonical array header and checks that n elements of at
// least minElem bytes each fit in the remaining input, before anyone
// allocates for them.
func (d *decoder) arrayLen(field string, minElem int) (int, error) {
	c, ok := d.byte1(field)
	if !ok {
		return 0, d.err
	}
	var n, min int
	switch {
	case c >= 0x90 && c <= 0x9f:
		n = int(c & 0x0f)
	case c == 0xdc:
		p := d.take(field, 2)
		if p == nil {
			return 0, d.err
		}
		n, min = int(binary.BigEndian.Uint16(p)), 16
	case c == 0xdd:
		p := d.take(field, 4)
		if p == nil {
			return 0, d.err
		}
		n, min = int(binary.BigEndian.Uint32(p)), math.MaxUint16+1
	default:
		d.fail("%s: want an array, got msgpack code 0x%02x", field, c)
		return 0, d.err
	}
	if n < min {
		d.fail("%s: array length %d not in its shortest encoding", field, n)
		return 0, d.err
	}
	if n > d.remaining()/minElem {
		d.fail("%s: array of %d elements cannot fit in the %d bytes left", field, n, d.remaining())
		return 0, d.err
	}
	return n, nil
}

// mapLen reads a canonical map header and checks that n entries of at
// least minEntry bytes each fit in the remaining input.
func (d *decoder) mapLen(field string, minEntry int) int {
	c, ok := d.byte1(field)
	if !ok {
		return 0
	}
	var n, min int
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = int(c & 0x0f)
	case c == 0xde:
		p := d.take(field, 2)
		if p == nil {
			return 0
		}
		n, min = int(binary.BigEndian.Uint16(p)), 16
	default:
		d.fail("%s: want a map, got msgpack code 0x%02x", field, c)
		return 0
	}
	if n < min {
		d.fail("%s: map length %d not in its shortest encoding", field, n)
		return 0
	}
	if n > d.remaining()/minEntry {
		d.fail("%s: map of %d entries cannot fit in the %d bytes left", field, n, d.remaining())
		return 0
	}
	return n
}

// record reads the header of a positional record of exactly fields fields.
func (d *decoder) record(field string, fields int) error {
	n, err := d.arrayLen(field, 1)
	if err != nil {
		return err
	}
	if n != fields {
		d.fail("%s: record of %d fields, want %d", field, n, fields)
		return d.err
	}
	return nil
}

func (d *decoder) end() error {
	if d.err != nil {
		return d.err
	}
	if d.remaining() != 0 {
		return d.errorf("%d trailing bytes", d.remaining())
	}
	return nil
}
