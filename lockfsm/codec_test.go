package lockfsm

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var sampleCommands = []Command{
	{Op: OpOpenSession, Owner: "node-1", TTLMillis: 10_000},
	{Op: OpOpenSession, Owner: "node-2", TTLMillis: 5_000, Label: math.MaxUint64, Capped: true},
	{Op: OpAcquire, Session: 1, Req: 200, Ack: 150, Key: "invoice/42", Wait: true, Limit: 1},
	{Op: OpAcquire, Session: math.MaxUint64, Req: math.MaxUint32 + 1, Key: strings.Repeat("k", MaxKeyLen), Limit: math.MaxUint32},
	{Op: OpRelease, Session: 1, Req: 201, Target: 200},
	{Op: OpCancel, Session: 1, Req: 70000, Target: 65536},
	{Op: OpExpireSession, Session: 300},
	{Op: OpCloseSession, Session: 1, Owner: strings.Repeat("o", MaxOwnerLen)},
	{Op: OpLeaderTerm, Term: 1 << 40},
	{Op: OpExpireSession, Session: 9, Term: 3, Ack: 1},
	{Op: OpAcquire, Session: 3, Req: 4, Key: "s", Kind: KindSemaphore, Limit: 9, Permits: 2, Group: 2, Flags: FlagDetail, MaxHoldMillis: 1 << 40},
	{Op: OpExpireHold, Session: 3, Target: 4, Term: 7},
	{Op: OpAcquire, Session: 3, Req: 5, Key: "leader", Value: []byte("host-1:8080"), Priority: 7},
	{Op: OpSetValue, Session: 3, Req: 6, Target: 5, Value: []byte{0, 0xff, 'v'}},
}

func TestCommandsRoundTrip(t *testing.T) {
	for _, format := range []byte{FormatPositional, FormatTagged} {
		sampleCommands := sampleCommands
		if format == FormatPositional { // it has no fields or ops of level 3
			sampleCommands = slices.DeleteFunc(slices.Clone(sampleCommands), func(c Command) bool { return c.FeatureLevel() >= 3 })
		}
		b, err := EncodeCommandsFormat(format, sampleCommands)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] != format {
			t.Fatalf("format %d: first byte %d", format, b[0])
		}
		got, err := DecodeCommands(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, sampleCommands) {
			t.Fatalf("format %d: round trip:\n%+v\n%+v", format, got, sampleCommands)
		}
		// Standard msgpack: the library reads what we write.
		var v []any
		if format == FormatTagged {
			var m []map[uint8]any
			err = msgpack.Unmarshal(b[1:], &m)
			v = make([]any, len(m))
		} else {
			err = msgpack.Unmarshal(b[1:], &v)
		}
		if err != nil || len(v) != len(sampleCommands) {
			t.Fatalf("format %d: msgpack.Unmarshal: %v, %d records", format, err, len(v))
		}
	}
	if b, _ := EncodeCommands(sampleCommands); b[0] != Version {
		t.Fatalf("EncodeCommands wrote format %d, want %d", b[0], Version)
	}
	if _, err := EncodeCommandsFormat(1, sampleCommands); !errors.Is(err, ErrVersion) {
		t.Fatalf("format 1: %v, want ErrVersion", err)
	}
}

// The tagged format leaves zero fields out, so a new field costs old
// commands nothing and a command is smaller than its positional record.
func TestTaggedIsCompact(t *testing.T) {
	cmd := []Command{{Op: OpAcquire, Session: 1, Req: 7, Key: "k"}}
	pos, _ := EncodeCommandsFormat(FormatPositional, cmd)
	tagged, _ := EncodeCommandsFormat(FormatTagged, cmd)
	want := []byte{FormatTagged, 0x91, 0x84, tagOp, byte(OpAcquire), tagSession, 1, tagReq, 7, tagKey, 0xa1, 'k'}
	if !bytes.Equal(tagged, want) {
		t.Fatalf("tagged encoding\n got % x\nwant % x", tagged, want)
	}
	if len(tagged) >= len(pos) {
		t.Fatalf("tagged %d bytes, positional %d", len(tagged), len(pos))
	}
}

// A command with an op or a field this release does not know fails with
// ErrUnsupported, whatever the format: the replica must stop, not skip it.
func TestDecodeRefusesWhatItDoesNotKnow(t *testing.T) {
	if _, err := EncodeCommands([]Command{{Op: maxOp + 1}}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("encoding an unknown op: %v", err)
	}
	if MinCommandFormat(sampleCommands[:1]) != FormatPositional || MinCommandFormat(sampleCommands) != FormatTagged {
		t.Errorf("MinCommandFormat: %d without a Label, %d with one", MinCommandFormat(sampleCommands[:1]), MinCommandFormat(sampleCommands))
	}
	// The positional format has no place for a Label: it is refused, not
	// dropped.
	if _, err := EncodeCommandsFormat(FormatPositional, []Command{{Op: OpOpenSession, Owner: "n", TTLMillis: 1, Label: 7}}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("encoding a Label in the positional format: %v, want ErrUnsupported", err)
	}
	cases := map[string][]byte{
		"tagged unknown op":     {FormatTagged, 0x91, 0x81, tagOp, byte(maxOp + 1)},
		"tagged unknown field":  {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), maxTag + 1, 0x01},
		"tagged far field":      {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), 0xcc, 0xc8, 0xc3},
		"positional unknown op": {FormatPositional, 0x91, 0x9b, 0x63, 0, 0, 0, 0xa0, 0xc2, 0, 0, 0xa0, 0, 0},
		"v1 unknown op":         {1, 0x91, 0x9a, 0x63, 0, 0, 0, 0xa0, 0xc2, 0, 0, 0xa0, 0},
	}
	for name, b := range cases {
		if _, err := DecodeCommands(b); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want ErrUnsupported", name, err)
		} else if !strings.Contains(err.Error(), "upgrade this peer") {
			t.Errorf("%s: error %q does not say what to do", name, err)
		}
	}
}

func TestDecodeTaggedErrors(t *testing.T) {
	cases := map[string][]byte{
		"no op":            {FormatTagged, 0x91, 0x81, tagSession, 0x01},
		"empty map":        {FormatTagged, 0x91, 0x80},
		"tags descend":     {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), tagOp, byte(OpAcquire)},
		"tag repeats":      {FormatTagged, 0x91, 0x83, tagOp, byte(OpAcquire), tagReq, 1, tagReq, 2},
		"explicit zero":    {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), tagReq, 0},
		"explicit empty":   {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), tagKey, 0xa0},
		"explicit false":   {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), tagWait, 0xc2},
		"capped false":     {FormatTagged, 0x91, 0x82, tagOp, byte(OpOpenSession), tagCapped, 0xc2},
		"wrong type":       {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), tagKey, 0x01},
		"record not map":   {FormatTagged, 0x91, 0x91, 0x01},
		"map too long":     {FormatTagged, 0x91, 0x8f, tagOp, byte(OpAcquire)},
		"non-minimal map":  {FormatTagged, 0x91, 0xde, 0x00, 0x01, tagOp, byte(OpAcquire)},
		"limit over 32bit": {FormatTagged, 0x91, 0x82, tagOp, byte(OpAcquire), tagLimit, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0},
	}
	for name, b := range cases {
		if _, err := DecodeCommands(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func TestResultsRoundTrip(t *testing.T) {
	rs := []Result{ok, granted(1), released(math.MaxUint64), {Status: StatusOK, Session: 1<<63 | 5<<12 | 3}, {Status: StatusInvalid, Err: strings.Repeat("e", MaxErrLen)}}
	b, err := EncodeResults(rs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeResults(b)
	if err != nil || !reflect.DeepEqual(got, rs) {
		t.Fatalf("round trip: %v\n%+v", err, got)
	}
	if b, err := EncodeResults(nil); err != nil {
		t.Fatal(err)
	} else if got, err := DecodeResults(b); err != nil || len(got) != 0 {
		t.Fatalf("empty results: %+v %v", got, err)
	}
}

func TestEncodeRejectsWhatCannotDecode(t *testing.T) {
	for name, cmds := range map[string][]Command{
		"empty":      nil,
		"too many":   make([]Command, MaxBatch+1),
		"long key":   {{Op: OpAcquire, Key: strings.Repeat("k", MaxKeyLen+1)}},
		"long owner": {{Op: OpOpenSession, Owner: strings.Repeat("o", MaxOwnerLen+1)}},
	} {
		if _, err := EncodeCommands(cmds); err == nil {
			t.Errorf("%s: EncodeCommands succeeded", name)
		}
	}
	if _, err := EncodeResults([]Result{{Err: strings.Repeat("e", MaxErrLen+1)}}); err == nil {
		t.Errorf("EncodeResults with a long Err succeeded")
	}
	// The largest legal batch fits in MaxEntrySize, so EncodeCommands never
	// fails on size alone.
	big := slices.Repeat([]Command{{Op: OpAcquire, Session: math.MaxUint64, Req: math.MaxUint64, Ack: math.MaxUint64, Key: strings.Repeat("k", MaxKeyLen), Wait: true,
		Limit: math.MaxUint32, Target: math.MaxUint64, Owner: strings.Repeat("o", MaxOwnerLen), TTLMillis: math.MaxUint64, Term: math.MaxUint64}}, MaxBatch)
	for _, format := range []byte{FormatPositional, FormatTagged} {
		if _, err := EncodeCommandsFormat(format, big); err != nil {
			t.Errorf("format %d: a batch of MaxBatch max-size keys: %v", format, err)
		}
	}
}

func TestDecodeCommandsErrors(t *testing.T) {
	good, _ := EncodeCommandsFormat(FormatPositional, []Command{sampleCommands[0], sampleCommands[2]})
	const Version = FormatPositional // the records below are positional
	cases := map[string][]byte{
		"empty":          {},
		"version only":   {Version},
		"wrong version":  append([]byte{FormatTagged + 1}, good[1:]...),
		"trailing byte":  append(slices.Clone(good), 0),
		"empty batch":    {Version, 0x90},
		"not an array":   {Version, 0xa1, 'x'},
		"short record":   {Version, 0x91, 0x92, 0x01, 0x01},
		"negative int":   {Version, 0x91, 0x9b, 0xff, 0, 0, 0, 0xa0, 0xc2, 0, 0, 0xa0, 0, 0},
		"non-minimal":    {Version, 0x91, 0x9b, 0xcc, 0x01, 0, 0, 0, 0xa0, 0xc2, 0, 0, 0xa0, 0, 0},
		"op too large":   {Version, 0x91, 0x9b, 0xcd, 0x01, 0x00, 0, 0, 0, 0xa0, 0xc2, 0, 0, 0xa0, 0, 0},
		"nil bool":       {Version, 0x91, 0x9b, 0x02, 0, 0, 0, 0xa0, 0xc0, 0, 0, 0xa0, 0, 0},
		"limit too big":  {Version, 0x91, 0x9b, 0x02, 0, 0, 0, 0xa0, 0xc2, 0xcf, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0xa0, 0, 0},
		"truncated":      good[:len(good)-1],
		"oversized":      append([]byte{Version}, make([]byte, MaxEntrySize)...),
		"key over limit": append([]byte{Version, 0x91, 0x9b, 0x02, 0, 0, 0, 0xda, 0x02, 0x01}, make([]byte, 513)...),
	}
	for name, b := range cases {
		_, err := DecodeCommands(b)
		if err == nil {
			t.Errorf("%s: decoded", name)
			continue
		}
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
			t.Errorf("%s: %v wraps neither ErrCorrupt nor ErrVersion", name, err)
		}
		if !strings.HasPrefix(err.Error(), "lockfsm: decode commands") {
			t.Errorf("%s: undescriptive error %q", name, err)
		}
	}
	if _, err := DecodeCommands(append([]byte{FormatTagged + 1}, good[1:]...)); !errors.Is(err, ErrVersion) {
		t.Errorf("wrong version: %v", err)
	}
}

// Version 1 batches, written before Command.Term existed, still decode
// (with Term 0), so logs of earlier releases replay after an upgrade.
func TestDecodeCommandsVersion1(t *testing.T) {
	// [[ExpireSession, session 7, req 0, ack 0, "", false, 0, 0, "", 0]]
	v1 := []byte{1, 0x91, 0x9a, byte(OpExpireSession), 7, 0, 0, 0xa0, 0xc2, 0, 0, 0xa0, 0}
	got, err := DecodeCommands(v1)
	if err != nil {
		t.Fatal(err)
	}
	want := []Command{{Op: OpExpireSession, Session: 7}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	// An 11-field record is not version 1.
	if _, err := DecodeCommands([]byte{1, 0x91, 0x9b, 5, 7, 0, 0, 0xa0, 0xc2, 0, 0, 0xa0, 0, 0}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 1 with a term field: %v", err)
	}
}

// TestDecodeIsCanonical: whatever decodes re-encodes to the same bytes, for
// every prefix-and-mutation of a valid encoding.
func TestDecodeIsCanonical(t *testing.T) {
	good, _ := EncodeCommands(sampleCommands)
	for i := range good {
		b := slices.Clone(good)
		b[i] ^= 0x01
		cmds, err := DecodeCommands(b)
		if err != nil {
			continue
		}
		again, err := EncodeCommands(cmds)
		if err != nil || !bytes.Equal(again, b) {
			t.Errorf("byte %d: decode/encode not the identity: %v", i, err)
		}
	}
}
