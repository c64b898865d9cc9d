package lockfsm

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// opens is n OpenSessions of owner, Capped as a writer at feature level 3
// makes them or not.
func opens(n int, owner string, capped bool) []Command {
	cmds := make([]Command, n)
	for i := range cmds {
		cmds[i] = Command{Op: OpOpenSession, Owner: owner, TTLMillis: 1000, Capped: capped}
	}
	return cmds
}

// capStep is one entry of a session caps case. cmds makes it from the ids
// of the sessions opened so far, oldest first.
type capStep struct {
	cmds func(opened []uint64) []Command
	// opened and refused are how many of the entry's OpenSessions open a
	// session and are refused with StatusSessionLimit; refusals come after
	// every open of the same owner. refusal is in each refusal's Err.
	opened, refused int
	refusal         string
}

func entry(cmds ...[]Command) func([]uint64) []Command {
	return func([]uint64) []Command { return slices.Concat(cmds...) }
}

// Capped OpenSessions are refused on apply once the shard or the owner
// holds what the caps allow, whoever accepted them and however they were
// batched; the counts follow every open, close and expiry, and survive a
// snapshot.
func TestSessionCaps(t *testing.T) {
	ownerFull := func(n int) string {
		return fmt.Sprintf(`owner "a" holds %d sessions on the shard, the limit MaxSessionsPerOwner is %d`, n, MaxSessionsPerOwner)
	}
	for _, tc := range []struct {
		name  string
		steps []capStep
		owned map[string]int // SessionCount of each owner after the steps
	}{
		{name: "the owner's cap, in one entry", steps: []capStep{
			{cmds: entry(opens(MaxSessionsPerOwner, "a", true)), opened: MaxSessionsPerOwner},
			{cmds: entry(opens(1, "a", true)), refused: 1, refusal: ownerFull(MaxSessionsPerOwner)},
			{cmds: entry(opens(1, "b", true)), opened: 1},
		}, owned: map[string]int{"a": MaxSessionsPerOwner, "b": 1}},
		// The race of the review: two proposals each under the cap at
		// accept time, committed one after the other.
		{name: "two entries under the cap that together exceed it", steps: []capStep{
			{cmds: entry(opens(3000, "a", true)), opened: 3000},
			{cmds: entry(opens(3000, "a", true)), opened: MaxSessionsPerOwner - 3000, refused: 6000 - MaxSessionsPerOwner, refusal: ownerFull(MaxSessionsPerOwner)},
		}, owned: map[string]int{"a": MaxSessionsPerOwner}},
		{name: "another owner's opens in the same entry go on", steps: []capStep{
			{cmds: entry(opens(MaxSessionsPerOwner-2, "a", true)), opened: MaxSessionsPerOwner - 2},
			{cmds: entry(opens(5, "a", true), opens(3, "b", true)), opened: 5, refused: 3, refusal: ownerFull(MaxSessionsPerOwner)},
		}, owned: map[string]int{"a": MaxSessionsPerOwner, "b": 3}},
		// Entries written below level 3 carry no Capped and open as
		// before caps existed: their sessions count, and a later capped
		// open is refused naming the count.
		{name: "opens without Capped are not capped, but counted", steps: []capStep{
			{cmds: entry(opens(MaxSessionsPerOwner, "a", false)), opened: MaxSessionsPerOwner},
			{cmds: entry(opens(10, "a", false)), opened: 10},
			{cmds: entry(opens(1, "a", true)), refused: 1, refusal: ownerFull(MaxSessionsPerOwner + 10)},
		}, owned: map[string]int{"a": MaxSessionsPerOwner + 10}},
		{name: "a close makes room", steps: []capStep{
			{cmds: entry(opens(MaxSessionsPerOwner, "a", true)), opened: MaxSessionsPerOwner},
			{cmds: func(opened []uint64) []Command {
				return slices.Concat([]Command{closeS(opened[0]), closeS(opened[1])}, opens(3, "a", true))
			}, opened: 2, refused: 1, refusal: ownerFull(MaxSessionsPerOwner)},
		}, owned: map[string]int{"a": MaxSessionsPerOwner}},
		{name: "an expiry makes room, a stale one does not", steps: []capStep{
			{cmds: entry([]Command{leaderTerm(4)}, opens(MaxSessionsPerOwner-1, "a", true)), opened: MaxSessionsPerOwner - 1},
			{cmds: func(opened []uint64) []Command {
				return slices.Concat([]Command{expireIn(opened[0], 3)}, opens(2, "a", true))
			}, opened: 1, refused: 1, refusal: ownerFull(MaxSessionsPerOwner)},
			{cmds: func(opened []uint64) []Command {
				return slices.Concat([]Command{expireIn(opened[0], 4)}, opens(2, "a", true))
			}, opened: 1, refused: 1, refusal: ownerFull(MaxSessionsPerOwner)},
		}, owned: map[string]int{"a": MaxSessionsPerOwner}},
		{name: "the shard's cap", steps: slices.Concat(
			capSteps(MaxSessions/MaxSessionsPerOwner, func(i int) capStep {
				return capStep{cmds: entry(opens(MaxSessionsPerOwner, fmt.Sprint("n", i), true)), opened: MaxSessionsPerOwner}
			}),
			[]capStep{
				{cmds: entry(opens(1, "z", true)), refused: 1, refusal: fmt.Sprintf("the shard holds %d sessions, the limit MaxSessions is %d", MaxSessions, MaxSessions)},
				{cmds: entry(opens(1, "z", false)), opened: 1},
			},
		), owned: map[string]int{"n0": MaxSessionsPerOwner, "n15": MaxSessionsPerOwner, "z": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker()
			var opened []uint64
			for i, st := range tc.steps {
				cmds := st.cmds(opened)
				rs, _, err := c.apply(cmds...)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				nOpened, nRefused := 0, 0
				full := map[string]bool{} // owners refused in this entry
				for j, r := range rs {
					if cmds[j].Op != OpOpenSession {
						continue
					}
					switch r.Status {
					case StatusOK:
						if full[cmds[j].Owner] {
							t.Fatalf("step %d: command %d of %q opened after one of the owner's was refused", i, j, cmds[j].Owner)
						}
						nOpened++
						opened = append(opened, r.Session)
					case StatusSessionLimit:
						if !strings.Contains(r.Err, st.refusal) {
							t.Fatalf("step %d: refusal %q, want it to say %q", i, r.Err, st.refusal)
						}
						full[cmds[j].Owner] = true
						nRefused++
					default:
						t.Fatalf("step %d: command %d: %+v", i, j, r)
					}
				}
				if nOpened != st.opened || nRefused != st.refused {
					t.Fatalf("step %d: %d opened and %d refused, want %d and %d", i, nOpened, nRefused, st.opened, st.refused)
				}
			}
			total, _ := c.s.SessionCount("")
			if total != len(c.s.Sessions()) {
				t.Errorf("SessionCount total %d, %d sessions live", total, len(c.s.Sessions()))
			}
			for owner, want := range tc.owned {
				if _, got := c.s.SessionCount(owner); got != want {
					t.Errorf("SessionCount(%q) = %d, want %d", owner, got, want)
				}
			}
			checkCapsAfterLoad(t, c.s)
		})
	}
}

func capSteps(n int, step func(i int) capStep) []capStep {
	out := make([]capStep, n)
	for i := range out {
		out[i] = step(i)
	}
	return out
}

// checkCapsAfterLoad restores s from its snapshot, which does not carry
// the counts, and checks the restored state counts alike and refuses the
// same opens: one of each owner and of a new one.
func checkCapsAfterLoad(t *testing.T, s *State) {
	t.Helper()
	r := New()
	if err := r.Load(bytes.NewReader(snapshot(t, s))); err != nil {
		t.Fatal(err)
	}
	var next []Command
	for _, si := range s.Sessions() {
		if _, want := s.SessionCount(si.Owner); !slices.ContainsFunc(next, func(c Command) bool { return c.Owner == si.Owner }) {
			if _, got := r.SessionCount(si.Owner); got != want {
				t.Errorf("restored SessionCount(%q) = %d, want %d", si.Owner, got, want)
			}
			next = append(next, opens(1, si.Owner, true)...)
		}
	}
	next = append(next, opens(1, "new", true)...)
	next = next[:min(len(next), MaxBatch)]
	want, _ := s.Apply(s.Index()+1, next)
	got, _ := r.Apply(r.Index()+1, next)
	if !slices.EqualFunc(got, want, func(a, b Result) bool { return a.Status == b.Status && a.Session == b.Session && a.Err == b.Err }) {
		t.Errorf("a restored state answers the next opens otherwise:\n got %+v\nwant %+v", got, want)
	}
	if err := r.Verify(); err != nil {
		t.Error(err)
	}
}

// Verify catches counts that drifted from the sessions.
func TestVerifyChecksSessionCounts(t *testing.T) {
	s := New()
	s.Apply(1, opens(3, "a", true))
	s.Apply(2, []Command{closeS(1)})
	if err := s.Verify(); err != nil {
		t.Fatal(err)
	}
	for name, drift := range map[string]func(){
		"a count too high":     func() { s.owned["a"]++ },
		"a count left at zero": func() { s.owned["gone"] = 0 },
		"a count missing":      func() { delete(s.owned, "a") },
	} {
		saved := maps.Clone(s.owned)
		drift()
		if err := s.Verify(); err == nil {
			t.Errorf("%s: Verify saw nothing", name)
		}
		s.owned = saved
	}
}

// An OpenSession without Capped, which every entry written below feature
// level 3 is, applies as it did before caps existed: a level-2 cluster's
// log, whose accept-time checks raced, replays to the same sessions. Its
// encoding has not changed either.
func TestUncappedOpensReplayAsBefore(t *testing.T) {
	// What releases before caps wrote for an open of "a" with a TTL of
	// 1000 ms, in both formats: no tag 18.
	tagged := []byte{FormatTagged, 0x91, 0x83, tagOp, byte(OpOpenSession), tagOwner, 0xa1, 'a', tagTTL, 0xcd, 0x03, 0xe8}
	positional := []byte{FormatPositional, 0x91, 0x9b, byte(OpOpenSession), 0, 0, 0, 0xa0, 0xc2, 0, 0, 0xa1, 'a', 0xcd, 0x03, 0xe8, 0}
	for _, b := range [][]byte{tagged, positional} {
		if got, err := EncodeCommandsFormat(b[0], opens(1, "a", false)); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("format %d: an uncapped open encodes as % x, %v; releases before caps wrote % x", b[0], got, err, b)
		}
	}
	// More than the owner's cap, in entries of both formats.
	s := New()
	index := uint64(0)
	for _, format := range []byte{FormatPositional, FormatTagged, FormatPositional} {
		raw, err := EncodeCommandsFormat(format, opens(MaxSessionsPerOwner/2+1, "a", false))
		if err != nil {
			t.Fatal(err)
		}
		cmds, err := DecodeCommands(raw)
		if err != nil {
			t.Fatal(err)
		}
		index++
		rs, _ := s.Apply(index, cmds)
		for i, r := range rs {
			want := index
			if i > 0 {
				want = extraSessionBit | index<<12 | uint64(i)
			}
			if r.Status != StatusOK || r.Session != want {
				t.Fatalf("entry %d, open %d: %+v, want session %d opened as before caps", index, i, r, want)
			}
		}
	}
	if _, owned := s.SessionCount("a"); owned != 3*(MaxSessionsPerOwner/2+1) {
		t.Fatalf("owner a counted %d sessions, want %d", owned, 3*(MaxSessionsPerOwner/2+1))
	}
	if err := s.Verify(); err != nil {
		t.Fatal(err)
	}
	// Capped is a field of level 3: the positional format cannot carry it.
	if _, err := EncodeCommandsFormat(FormatPositional, opens(1, "a", true)); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("a Capped open in the positional format: %v, want ErrUnsupported", err)
	}
	if MinCommandFormat(opens(1, "a", true)) != FormatTagged {
		t.Fatal("MinCommandFormat of a Capped open is not FormatTagged")
	}
}

// The caps cost O(1) per OpenSession: the flood of the review, 4,096
// opens in one entry on a shard of 16,384 sessions, applies in
// milliseconds and allocates what the new sessions need, not a pass over
// the table per open (that took 24 s and 4.1 GiB at accept time).
func TestSessionCapsCostO1(t *testing.T) {
	s := New()
	for i := range uint64(4) {
		var cmds []Command
		for j := range MaxBatch {
			cmds = append(cmds, Command{Op: OpOpenSession, Owner: fmt.Sprint("peer-", j%8), TTLMillis: 60_000, Capped: true})
		}
		s.Apply(i+1, cmds)
	}
	flood := opens(MaxBatch, "mallory", true)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	rs, _ := s.Apply(5, flood)
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if n := len(s.Sessions()); n != 5*MaxBatch {
		t.Fatalf("%d sessions, want %d", n, 5*MaxBatch)
	}
	if rs[MaxBatch-1].Status != StatusOK {
		t.Fatalf("last open: %+v", rs[MaxBatch-1])
	}
	perOpen := (after.TotalAlloc - before.TotalAlloc) / MaxBatch
	t.Logf("%d capped opens on a shard of %d sessions: %v, %d bytes and %.1f allocations per open",
		MaxBatch, 4*MaxBatch, took, perOpen, float64(after.Mallocs-before.Mallocs)/MaxBatch)
	// A session and its attempt map take a few hundred bytes; one pass
	// over the table would be 16,384 entries.
	if perOpen > 1024 {
		t.Errorf("%d bytes allocated per open: the caps cost more than O(1)", perOpen)
	}
	if took > time.Second {
		t.Errorf("%v for %d opens: the caps cost more than O(1)", took, MaxBatch)
	}
}
