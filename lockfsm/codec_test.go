package lockfsm

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

var sampleCommands = []Command{
	{Op: OpOpenSession, Owner: "node-1", TTLMillis: 10_000},
	{Op: OpAcquire, Session: 1, Req: 200, Ack: 150, Key: "invoice/42", Wait: true, Limit: 1},
	{Op: OpAcquire, Session: math.MaxUint64, Req: math.MaxUint32 + 1, Key: strings.Repeat("k", MaxKeyLen), Limit: math.MaxUint32},
	{Op: OpRelease, Session: 1, Req: 201, Target: 200},
	{Op: OpCancel, Session: 1, Req: 70000, Target: 65536},
	{Op: OpExpireSession, Session: 300},
	{Op: OpCloseSession, Session: 1, Owner: strings.Repeat("o", MaxOwnerLen)},
	{Op: 99},
}

func TestCommandsRoundTrip(t *testing.T) {
	b, err := EncodeCommands(sampleCommands)
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != Version {
		t.Fatalf("first byte %d", b[0])
	}
	got, err := DecodeCommands(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, sampleCommands) {
		t.Fatalf("round trip:\n%+v\n%+v", got, sampleCommands)
	}
	// Standard msgpack: the library reads what we write.
	var v []any
	if err := msgpack.Unmarshal(b[1:], &v); err != nil || len(v) != len(sampleCommands) {
		t.Fatalf("msgpack.Unmarshal: %v, %d records", err, len(v))
	}
}

func TestResultsRoundTrip(t *testing.T) {
	rs := []Result{ok, granted(1), released(math.MaxUint64), {Status: StatusOK, Session: 1<<63 | 5<<12 | 3}, {Status: StatusInvalid, Err: strings.Repeat("e", MaxErrLen)}}
	b, err := EncodeResults(rs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeResults(b)
	if err != nil || !slices.Equal(got, rs) {
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
	big := slices.Repeat([]Command{{Op: 255, Session: math.MaxUint64, Req: math.MaxUint64, Ack: math.MaxUint64, Key: strings.Repeat("k", MaxKeyLen), Wait: true,
		Limit: math.MaxUint32, Target: math.MaxUint64, Owner: strings.Repeat("o", MaxOwnerLen), TTLMillis: math.MaxUint64}}, MaxBatch)
	if _, err := EncodeCommands(big); err != nil {
		t.Errorf("a batch of MaxBatch max-size keys: %v", err)
	}
}

func TestDecodeCommandsErrors(t *testing.T) {
	good, _ := EncodeCommands(sampleCommands[:2])
	cases := map[string][]byte{
		"empty":          {},
		"version only":   {Version},
		"wrong version":  append([]byte{Version + 1}, good[1:]...),
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
	if _, err := DecodeCommands(append([]byte{Version + 1}, good[1:]...)); !errors.Is(err, ErrVersion) {
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
	if !slices.Equal(got, want) {
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
