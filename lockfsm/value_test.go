package lockfsm

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// A holder's value comes with its Acquire, is replaced by its SetValue
// while it holds, and goes with the hold; a SetValue of a hold that
// ended, or of a waiter, changes nothing.
func TestValuesFollowTheHold(t *testing.T) {
	c := newChecker()
	must := func(want Status, cmds ...Command) Result {
		t.Helper()
		rs, _, err := c.apply(cmds...)
		if err != nil {
			t.Fatal(err)
		}
		if rs[0].Status != want {
			t.Fatalf("%v: %v (%s), want %v", cmds[0].Op, rs[0].Status, rs[0].Err, want)
		}
		return rs[0]
	}
	value := func(i int, holders bool) string {
		t.Helper()
		info, ok := c.s.Key("leader")
		list := info.Waiters
		if holders {
			list = info.Holders
		}
		if !ok || len(list) <= i {
			t.Fatalf("Key(leader) = %+v, %v: no %d-th", info, ok, i)
		}
		return string(list[i].Value)
	}
	a := must(StatusOK, Command{Op: OpOpenSession, Owner: "na", TTLMillis: 5000}).Session
	b := must(StatusOK, Command{Op: OpOpenSession, Owner: "nb", TTLMillis: 5000}).Session
	tok := must(StatusGranted, Command{Op: OpAcquire, Session: a, Req: 1, Key: "leader", Value: []byte("a:1")}).Token
	must(StatusQueued, Command{Op: OpAcquire, Session: b, Req: 1, Key: "leader", Wait: true, Value: []byte("b:1")})
	if value(0, true) != "a:1" || value(0, false) != "b:1" {
		t.Fatalf("values %q and %q, want a:1 held and b:1 waiting", value(0, true), value(0, false))
	}
	if r := must(StatusOK, Command{Op: OpSetValue, Session: a, Req: 2, Target: 1, Value: []byte("a:2")}); r.Token != tok {
		t.Fatalf("SetValue answered token %d, want the hold's %d", r.Token, tok)
	}
	must(StatusNotHeld, Command{Op: OpSetValue, Session: b, Req: 2, Target: 1, Value: []byte("b:2")})
	if value(0, true) != "a:2" || value(0, false) != "b:1" {
		t.Fatalf("values %q and %q after the holder's SetValue and the waiter's, want a:2 and b:1", value(0, true), value(0, false))
	}
	must(StatusOK, Command{Op: OpRelease, Session: a, Req: 3, Target: 1})
	// The released holder writes again: it lost the key, its successor's
	// value stands.
	must(StatusNotHeld, Command{Op: OpSetValue, Session: a, Req: 4, Target: 1, Value: []byte("a:late")})
	if value(0, true) != "b:1" {
		t.Fatalf("the successor's value %q, want b:1", value(0, true))
	}
	must(StatusOK, Command{Op: OpSetValue, Session: b, Req: 3, Target: 1})
	if value(0, true) != "" {
		t.Fatalf("an empty SetValue left %q", value(0, true))
	}
	big := bytes.Repeat([]byte("x"), MaxValueLen+1)
	for _, cmd := range []Command{
		{Op: OpAcquire, Session: a, Req: 5, Key: "k", Value: big},
		{Op: OpSetValue, Session: b, Req: 4, Target: 1, Value: big},
	} {
		if r := must(StatusInvalid, cmd); !strings.Contains(r.Err, "1025 bytes") {
			t.Errorf("%v of %d bytes: %q, want the size named", cmd.Op, len(big), r.Err)
		}
	}
	must(StatusOK, Command{Op: OpCloseSession, Session: b})
	if len(c.s.values) != 0 {
		t.Fatalf("values kept after every hold ended: %v", c.s.values)
	}
}

// A state with a value needs snapshot format 4: format 3 refuses it, and
// a format 3 snapshot of a state without values still loads.
func TestValuesNeedSnapshotFormat4(t *testing.T) {
	c := newChecker()
	c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 5000, Label: 7})
	c.apply(Command{Op: OpAcquire, Session: 1, Req: 1, Key: "x", Kind: KindWrite})
	var v3 bytes.Buffer
	if err := c.s.SaveFormat(&v3, 3); err != nil {
		t.Fatal(err)
	}
	if err := New().Load(bytes.NewReader(v3.Bytes())); err != nil {
		t.Fatalf("Load of format 3: %v", err)
	}
	c.apply(Command{Op: OpAcquire, Session: 1, Req: 2, Key: "y", Value: []byte("here")})
	if c.s.MinSnapshotFormat() != 4 {
		t.Fatalf("MinSnapshotFormat %d with a value, want 4", c.s.MinSnapshotFormat())
	}
	if err := c.s.SaveFormat(&bytes.Buffer{}, 3); !errors.Is(err, ErrVersion) {
		t.Fatalf("SaveFormat(3) of a state with a value: %v, want ErrVersion", err)
	}
	snap := snapshot(t, c.s)
	restored := New()
	if err := restored.Load(bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if info, _ := restored.Key("y"); len(info.Holders) != 1 || string(info.Holders[0].Value) != "here" {
		t.Fatalf("restored Key(y) = %+v, want its value", info)
	}
}

// The feature level a command needs decides who may propose it.
func TestFeatureLevel(t *testing.T) {
	for _, tc := range []struct {
		cmd  Command
		want uint8
	}{
		{Command{Op: OpAcquire, Key: "k"}, 1},
		{Command{Op: OpLeaderTerm, Term: 2}, 1},
		{Command{Op: OpAcquire, Key: "k", Kind: KindRead}, 3},
		{Command{Op: OpExpireHold}, 3},
		{Command{Op: OpOpenSession, Capped: true}, 3},
		{Command{Op: OpAcquire, Key: "k", Value: []byte("v")}, 4},
		{Command{Op: OpSetValue}, 4},
		{Command{Op: OpAcquire, Key: "k", Priority: 1}, 4},
	} {
		if got := tc.cmd.FeatureLevel(); got != tc.want {
			t.Errorf("%+v: level %d, want %d", tc.cmd, got, tc.want)
		}
	}
}

// A query's values are its own: changing one changes nothing in the
// state. A SetValue retried after a later one of the same holder
// committed (its answer was lost) is answered OK and leaves the later
// value.
func TestValuesAreCopiedAndOrdered(t *testing.T) {
	c := newChecker()
	c.apply(Command{Op: OpOpenSession, Owner: "na", TTLMillis: 5000})
	c.apply(Command{Op: OpAcquire, Session: 1, Req: 1, Key: "k", Value: []byte("one")})
	info, _ := c.s.Key("k")
	info.Holders[0].Value[0] = 'X'
	if again, _ := c.s.Key("k"); string(again.Holders[0].Value) != "one" {
		t.Fatalf("a change to a query's value reached the state: %q", again.Holders[0].Value)
	}
	c.apply(Command{Op: OpSetValue, Session: 1, Req: 3, Target: 1, Value: []byte("newer")})
	rs, _, err := c.apply(Command{Op: OpSetValue, Session: 1, Req: 2, Target: 1, Value: []byte("older")})
	if err != nil || rs[0].Status != StatusOK {
		t.Fatalf("the overtaken SetValue: %+v %v, want OK", rs, err)
	}
	if info, _ := c.s.Key("k"); string(info.Holders[0].Value) != "newer" {
		t.Fatalf("value %q after an overtaken SetValue, want the later one", info.Holders[0].Value)
	}
}
