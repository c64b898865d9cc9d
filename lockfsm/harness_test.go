package lockfsm

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
)

// checker applies entries and checks, after each, the invariants of Verify
// plus what only history shows: tokens strictly increase per key in grant
// order, across entries.
type checker struct {
	s         *State
	index     uint64
	lastToken map[string]uint64
}

func newChecker() *checker {
	return &checker{s: New(), lastToken: map[string]uint64{}}
}

func (c *checker) apply(cmds ...Command) ([]Result, []Grant, error) {
	c.index++
	rs, gs := c.s.Apply(c.index, cmds)
	if len(rs) != len(cmds) {
		return rs, gs, fmt.Errorf("entry %d: %d results for %d commands", c.index, len(rs), len(cmds))
	}
	if err := c.s.Verify(); err != nil {
		return rs, gs, fmt.Errorf("entry %d: %v", c.index, err)
	}
	var prev uint64
	for _, g := range gs {
		if g.Token <= prev {
			return rs, gs, fmt.Errorf("entry %d: grant tokens not ascending: %d after %d", c.index, g.Token, prev)
		}
		prev = g.Token
		if g.Token <= c.lastToken[g.Key] {
			return rs, gs, fmt.Errorf("entry %d: key %q token %d not above its previous %d", c.index, g.Key, g.Token, c.lastToken[g.Key])
		}
		c.lastToken[g.Key] = g.Token
	}
	for i, r := range rs {
		if r.Status < StatusOK || r.Status > StatusStaleTerm {
			return rs, gs, fmt.Errorf("entry %d: command %d: bad status %d", c.index, i, r.Status)
		}
		if (r.Status == StatusInvalid || r.Status == StatusStaleTerm) != (r.Err != "") {
			return rs, gs, fmt.Errorf("entry %d: command %d: status %v with err %q", c.index, i, r.Status, r.Err)
		}
	}
	return rs, gs, nil
}

func snapshot(t testing.TB, s *State) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := s.Save(&buf); err != nil {
		t.Fatalf("Save: %v", err)
	}
	return buf.Bytes()
}

// genLog turns bytes into a log of entries over a small domain (a few
// sessions, keys and request ids) so that collisions, hand-offs, duplicates
// and expiries are frequent. Session ids are guessed from the entry indexes,
// so some commands hit closed or never-opened sessions.
func genLog(data []byte) [][]Command {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	keys := []string{"a", "b", "c", "dir/x"}
	var log [][]Command
	for len(data) > 0 && len(log) < 256 {
		n := int(next()%4) + 1
		entry := make([]Command, 0, n)
		for i := 0; i < n && len(data) > 0; i++ {
			b := next()
			c := Command{
				Session: uint64(next() % 12),
				Req:     uint64(next() % 16),
				Ack:     uint64(next() % 8),
				Key:     keys[next()%uint8(len(keys))],
				Wait:    b&0x80 != 0,
				Limit:   uint32(b>>4) % 3,
				Target:  uint64(next() % 16),
			}
			switch b % 16 {
			case 0, 1:
				c.Op = OpOpenSession
				c.Owner = fmt.Sprintf("n%d", b%3)
				c.TTLMillis = 1000
				if b&0x40 != 0 {
					c.Label = uint64(b)<<32 | 1
				}
			case 2, 3, 4, 5, 6:
				c.Op = OpAcquire
			case 7, 8, 9:
				c.Op = OpRelease
			case 10, 11:
				c.Op = OpCancel
			case 12:
				c.Op = OpExpireSession
				c.Term = uint64(next() % 3)
			case 13:
				c.Op = OpCloseSession
			case 14:
				c.Op = Op(b) // mostly unknown ops
				if b&0x40 != 0 {
					c.Op = OpLeaderTerm
					c.Term = uint64(next() % 3) // 0 is invalid
				}
			default:
				c.Op = OpAcquire
				c.Limit = 1
			}
			if c.Session == 11 {
				// A session opened by a multi-open entry: index 1, position 1.
				c.Session = extraSessionBit | 1<<12 | 1
			}
			entry = append(entry, c)
		}
		log = append(log, entry)
	}
	return log
}

// queries collects every query answer, for comparing two states.
func queries(s *State) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "index=%d stats=%+v\n", s.Index(), s.Stats())
	for _, si := range s.Sessions() {
		fmt.Fprintf(&b, "session %+v\n", si)
		for req := uint64(0); req < 17; req++ {
			info, ok := s.Request(si.ID, req)
			fmt.Fprintf(&b, "  req %d %v %+v\n", req, ok, info)
		}
	}
	for _, k := range []string{"a", "b", "c", "dir/x", "zz"} {
		info, ok := s.Key(k)
		fmt.Fprintf(&b, "key %q %v %+v\n", k, ok, info)
	}
	return b.String()
}

// runLog applies log with checks, comparing a twin state fed the same log
// and a state restored from a snapshot in the middle.
func runLog(t testing.TB, log [][]Command) {
	t.Helper()
	a, b := newChecker(), newChecker()
	var restored *checker
	half := len(log) / 2
	for i, entry := range log {
		ra, ga, err := a.apply(entry...)
		if err != nil {
			t.Fatalf("%v\nentry: %+v", err, entry)
		}
		rb, gb, _ := b.apply(entry...)
		if !slices.Equal(ra, rb) || !slices.EqualFunc(ga, gb, func(x, y Grant) bool { return x == y }) {
			t.Fatalf("entry %d: twins disagree:\n%+v %+v\n%+v %+v", i, ra, ga, rb, gb)
		}
		if restored != nil {
			rr, gr, err := restored.apply(entry...)
			if err != nil {
				t.Fatalf("restored: %v", err)
			}
			if !slices.Equal(ra, rr) || !slices.Equal(ga, gr) {
				t.Fatalf("entry %d: restored state disagrees:\n%+v %+v\n%+v %+v", i, ra, ga, rr, gr)
			}
		}
		if i == half {
			snap := snapshot(t, a.s)
			restored = newChecker()
			if err := restored.s.Load(bytes.NewReader(snap)); err != nil {
				t.Fatalf("Load of a saved snapshot: %v", err)
			}
			restored.index = a.index
			for k, v := range a.lastToken {
				restored.lastToken[k] = v
			}
			if again := snapshot(t, restored.s); !bytes.Equal(snap, again) {
				t.Fatalf("Save after Load differs")
			}
			if qa, qr := queries(a.s), queries(restored.s); qa != qr {
				t.Fatalf("queries differ after Load:\n%s\n%s", qa, qr)
			}
		}
	}
	sa, sb := snapshot(t, a.s), snapshot(t, b.s)
	if !bytes.Equal(sa, sb) {
		t.Fatalf("twin snapshots differ")
	}
	if restored != nil {
		if sr := snapshot(t, restored.s); !bytes.Equal(sa, sr) {
			t.Fatalf("snapshot of the restored state differs from never snapshotting")
		}
	}
}
