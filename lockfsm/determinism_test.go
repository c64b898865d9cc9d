package lockfsm

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// TestRandomLogsDeterministic feeds random logs to twin states and to a state
// restored from a mid-log snapshot; all must agree byte for byte.
func TestRandomLogsDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 42))
		data := make([]byte, 200+r.IntN(2000))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		runLog(t, genLog(data))
	}
}

// The lock family's logs: the same checks, over logs where most commands
// are served.
func TestRandomFamilyLogsDeterministic(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 43))
		data := make([]byte, 500+r.IntN(3000))
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		runLog(t, genFamilyLog(data))
	}
}

// TestRandomLogsExercise makes sure the generated logs reach the states the
// determinism tests are meant to cover, so that test cannot pass vacuously.
func TestRandomLogsExercise(t *testing.T) {
	seen := map[Status]int{}
	handOffs, expiries := 0, 0
	// The lock family: shared reads, semaphore permits held at once,
	// groups granted whole at once and by hand-off.
	sharedReads, semaphoreShared, groupsNow, groupsHandedOff := 0, 0, 0, 0
	holdsExpired, holdExpiriesRefused := 0, 0
	for seed := uint64(1); seed <= 50; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		data := make([]byte, 2000)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		c := newChecker()
		log := genLog(data)
		if seed%2 == 0 {
			log = genFamilyLog(data)
		}
		for _, entry := range log {
			rs, gs, err := c.apply(entry...)
			if err != nil {
				t.Fatal(err)
			}
			immediate := 0
			for i, res := range rs {
				seen[res.Status]++
				if entry[i].Op == OpAcquire && res.Status == StatusGranted {
					immediate++
				}
				if entry[i].Op == OpExpireSession && res.Status == StatusOK {
					expiries++
				}
				if entry[i].Op == OpExpireHold {
					switch res.Status {
					case StatusReleased:
						holdsExpired++
					case StatusStaleTerm:
						holdExpiriesRefused++
					}
				}
			}
			if len(gs) > immediate {
				handOffs++
			}
			for i, res := range rs {
				if entry[i].Op == OpAcquire && entry[i].Group != 0 && res.Status == StatusGranted && i+1 < len(rs) && entry[i+1].Group != 0 && rs[i+1].Status == StatusGranted {
					groupsNow++
				}
			}
			byReq := map[[2]uint64]bool{}
			for _, g := range gs {
				if g.HandOff {
					byReq[[2]uint64{g.Session, g.Req}] = true
				}
			}
			for _, g := range gs {
				if g.HandOff && byReq[[2]uint64{g.Session, g.Req + 1}] {
					if info, ok := c.s.Request(g.Session, g.Req+1); ok && info.Found {
						groupsHandedOff++
					}
				}
			}
			for _, key := range []string{"a", "b", "c", "dir/x", "r1", "r2", "s1"} {
				info, ok := c.s.Key(key)
				if !ok || len(info.Holders) < 2 {
					continue
				}
				switch info.Role {
				case KindWrite:
					sharedReads++
				case KindSemaphore:
					semaphoreShared++
				}
			}
		}
	}
	for st := StatusOK; st <= StatusLimitMismatch; st++ {
		if seen[st] == 0 {
			t.Errorf("no %v result in the random logs", st)
		}
	}
	if handOffs == 0 || expiries == 0 {
		t.Errorf("random logs made %d hand-off entries and %d expiries", handOffs, expiries)
	}
	if holdsExpired == 0 || holdExpiriesRefused == 0 {
		t.Errorf("random logs ended %d holds with ExpireHold and refused %d of a stale term", holdsExpired, holdExpiriesRefused)
	}
	if sharedReads == 0 || semaphoreShared == 0 || groupsNow == 0 || groupsHandedOff == 0 {
		t.Errorf("random logs held a read/write key by several readers %d times, a semaphore by several holders %d times, granted %d groups at once and %d by hand-off",
			sharedReads, semaphoreShared, groupsNow, groupsHandedOff)
	}
}

func TestSnapshotRoundTripAndQueries(t *testing.T) {
	c := newChecker()
	for _, e := range [][]Command{
		{{Op: OpOpenSession, Owner: "na", TTLMillis: 100}, {Op: OpOpenSession, Owner: "nb", TTLMillis: 200}},
		{acq(1, 1, "x", true), acq(1, 2, "y", false), sem(1<<63|1<<12|1, 1, "s", 3)},
		{acq(1<<63|1<<12|1, 2, "x", true), acq(1<<63|1<<12|1, 3, "y", false), cancel(1, 9)},
		{Command{Op: OpRelease, Session: 1, Req: 3, Target: 2}},
	} {
		if _, _, err := c.apply(e...); err != nil {
			t.Fatal(err)
		}
	}
	snap := snapshot(t, c.s)
	var s2 State
	if err := s2.Load(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap, snapshot(t, &s2)) {
		t.Fatal("Save after Load differs")
	}
	if q1, q2 := queries(c.s), queries(&s2); q1 != q2 {
		t.Fatalf("queries differ:\n%s\n%s", q1, q2)
	}
	// The snapshot is plain msgpack after the version byte.
	var v any
	if err := msgpack.Unmarshal(snap[1:], &v); err != nil {
		t.Fatalf("msgpack cannot read the snapshot: %v", err)
	}
	// Tokens survive: the next grant continues the shard counter.
	rs, _ := s2.Apply(s2.Index()+1, []Command{acq(1, 10, "new", true)})
	if !reflect.DeepEqual(rs[0], granted(c.s.Stats().NextToken)) {
		t.Errorf("grant after Load = %+v, want token %d", rs[0], c.s.Stats().NextToken)
	}
	// Loading replaces everything.
	if err := s2.Load(bytes.NewReader(snapshot(t, New()))); err != nil {
		t.Fatal(err)
	}
	if st := s2.Stats(); st != (Stats{NextToken: 1}) {
		t.Errorf("Stats after loading an empty snapshot = %+v", st)
	}
}

func TestLoadRejectsCorruptSnapshots(t *testing.T) {
	c := newChecker()
	c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 100})
	c.apply(acq(1, 1, "x", true))
	good := snapshot(t, c.s)
	for i := 0; i < len(good); i++ {
		for _, delta := range []byte{1, 0x80} {
			b := slices.Clone(good)
			b[i] += delta
			s := New()
			if err := s.Load(bytes.NewReader(b)); err == nil {
				// A changed byte may still be a valid, different state; it must then be canonical.
				if !bytes.Equal(b, snapshot(t, s)) {
					t.Errorf("byte %d+%d: loaded a non-canonical snapshot", i, delta)
				}
			} else if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrVersion) {
				t.Errorf("byte %d: error %v wraps neither ErrCorrupt nor ErrVersion", i, err)
			}
		}
	}
	for n := 0; n < len(good); n++ {
		if err := New().Load(bytes.NewReader(good[:n])); err == nil {
			t.Errorf("truncated snapshot of %d bytes loaded", n)
		}
	}
	// A holder whose session does not exist is an inconsistent state.
	s := New()
	s.index, s.lastToken = 1, 1
	s.keys["x"] = newLockKey(1, roleMutex)
	s.keys["x"].addHolder(ref{session: 7, req: 1})
	var buf bytes.Buffer
	s.Save(&buf)
	if err := New().Load(&buf); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "unknown session") {
		t.Errorf("Load of an inconsistent snapshot: %v", err)
	}
	// A holder's token is stored once, in its attempt: a snapshot whose
	// holder list gives another is refused. The holder record is the last
	// but two of the key's [key, limit, [[session, req, token]], [], role].
	c = newChecker()
	rs, _, _ := c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 100})
	c.apply(Command{Op: OpAcquire, Session: rs[0].Session, Req: 1, Key: "x", Wait: true})
	c.apply(Command{Op: OpAcquire, Session: rs[0].Session, Req: 2, Key: "y", Wait: true})
	good = snapshot(t, c.s)
	bad := slices.Clone(good)
	if bad[len(bad)-3] != 2 {
		t.Fatalf("snapshot does not end in y's holder token 2: % x", bad[len(bad)-8:])
	}
	bad[len(bad)-3] = 1
	if err := New().Load(bytes.NewReader(bad)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "token 1, its attempt's is 2") {
		t.Errorf("Load of a snapshot whose holder token is not its attempt's: %v", err)
	}
}

// A snapshot from a newer release (a version byte above SnapshotVersion) is
// refused, naming its version and the ones this release reads, and leaves
// the state as it was; Save refuses to write a format it does not know.
func TestLoadRefusesNewerSnapshotVersion(t *testing.T) {
	c := newChecker()
	c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 100})
	before := snapshot(t, c.s)
	newer := slices.Clone(before)
	newer[0] = SnapshotVersion + 1
	err := c.s.Load(bytes.NewReader(newer))
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("Load of a version %d snapshot: %v, want ErrVersion", SnapshotVersion+1, err)
	}
	for _, want := range []string{fmt.Sprintf("got version %d", SnapshotVersion+1), fmt.Sprintf("reads %d to %d", MinVersion, SnapshotVersion)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if after := snapshot(t, c.s); !bytes.Equal(before, after) {
		t.Error("a refused snapshot changed the state")
	}

	var buf bytes.Buffer
	if err := c.s.SaveFormat(&buf, SnapshotVersion+1); !errors.Is(err, ErrVersion) || buf.Len() != 0 {
		t.Fatalf("SaveFormat(%d): %v, %d bytes written; want ErrVersion and nothing", SnapshotVersion+1, err, buf.Len())
	}
	if err := c.s.SaveFormat(&buf, SnapshotVersion); err != nil || !bytes.Equal(buf.Bytes(), before) {
		t.Fatalf("SaveFormat(%d) = %v, or bytes differ from Save's", SnapshotVersion, err)
	}
}

// TestDecodersBoundAllocation: headers that claim huge containers must fail
// before anything of that size is allocated.
func TestDecodersBoundAllocation(t *testing.T) {
	huge := [][]byte{
		{Version, 0xdd, 0xff, 0xff, 0xff, 0xff},                                              // array32 of 4G commands
		{Version, 0xdc, 0x10, 0x00, 0x9a},                                                    // 4096 commands, one byte of body
		{FormatPositional, 0x91, 0x9b, 0x01, 0x01, 0x01, 0x01, 0xdb, 0xff, 0xff, 0xff, 0xff}, // 4 GB key
		{FormatTagged, 0x91, 0x82, tagOp, 0x02, tagKey, 0xdb, 0xff, 0xff, 0xff, 0xff},        // 4 GB key, tagged
		{FormatTagged, 0xdc, 0x10, 0x00, 0x81},                                               // 4096 tagged commands, one byte of body
	}
	snaps := [][]byte{
		{SnapshotVersion, 0x95, 0x01, 0x01, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff},                                     // 4G sessions
		{SnapshotVersion, 0x95, 0x01, 0x01, 0x01, 0x91, 0x95, 0x01, 0xa0, 0x01, 0x00, 0xdd, 0x7f, 0xff, 0xff, 0xff}, // 2G attempts
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for _, b := range huge {
		if _, err := DecodeCommands(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodeCommands(% x) = %v, want ErrCorrupt", b, err)
		}
		if _, err := DecodeResults(b); err == nil {
			t.Errorf("DecodeResults(% x) succeeded", b)
		}
	}
	for _, b := range snaps {
		if err := New().Load(bytes.NewReader(b)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("Load(% x) = %v, want ErrCorrupt", b, err)
		}
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("decoding tiny hostile inputs allocated %d bytes", d)
	}
}
