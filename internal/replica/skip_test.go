package replica

import (
	"testing"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// A replica told to skip an index passes over the entry there if it cannot
// read it, leaving its state as it was, and halts at any other unreadable
// entry; an entry it reads at that index is applied.
func TestSkipUnreadableEntry(t *testing.T) {
	var skipped []uint64
	var stopped []*lockerr.HaltError
	s := NewLock(LockConfig{Shard: 5, MaxFormat: lockfsm.Version, Halt: Halter{Skip: []uint64{2},
		OnSkip: func(_, index uint64, _ error) { skipped = append(skipped, index) },
		OnStop: func(he *lockerr.HaltError) { stopped = append(stopped, he) }}})
	open, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "a", TTLMillis: 1000}})
	if r, _ := s.Update(sm.Entry{Index: 1, Cmd: open}); r.Value != 1 {
		t.Fatalf("open session: %+v", r)
	}
	garbage := []byte{lockfsm.Version, 0xc1, 0xc1}
	if r, _ := s.Update(sm.Entry{Index: 2, Cmd: garbage}); r.Value != ResultHalted {
		t.Fatalf("skipped entry answered %+v, want ResultHalted (nothing applied)", r)
	}
	if len(skipped) != 1 || skipped[0] != 2 || len(stopped) != 0 {
		t.Fatalf("skipped %v, stopped %v; want index 2 skipped and no halt", skipped, stopped)
	}
	acquire, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpAcquire, Session: 1, Req: 1, Key: "k"}})
	if r, _ := s.Update(sm.Entry{Index: 3, Cmd: acquire}); r.Value != 1 {
		t.Fatalf("entry after the skipped one: %+v", r)
	}
	if _, ok := s.state.Key("k"); !ok {
		t.Fatal("the entry after the skipped one was not applied")
	}
	if r, _ := s.Update(sm.Entry{Index: 4, Cmd: garbage}); r.Value != ResultHalted || len(stopped) != 1 || stopped[0].Index != 4 {
		t.Fatalf("unreadable entry at another index: %+v, stopped %v; want a halt at 4", r, stopped)
	}

	// An entry the replica reads is applied even at the skipped index.
	s = NewLock(LockConfig{Shard: 5, MaxFormat: lockfsm.Version, Halt: Halter{Skip: []uint64{1}}})
	if r, _ := s.Update(sm.Entry{Index: 1, Cmd: open}); r.Value != 1 {
		t.Fatalf("readable entry at the skipped index: %+v, want applied", r)
	}

	// The meta shard skips the same way: the layout stays.
	m := NewMeta(Halter{Skip: []uint64{2}})
	raw, err := layout.Encode(layout.New(1, 2, 1, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: "h"}}))
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := m.Update(sm.Entry{Index: 1, Cmd: raw}); r.Value != 1 {
		t.Fatalf("layout: %+v", r)
	}
	if r, _ := m.Update(sm.Entry{Index: 2, Cmd: []byte{0xc1}}); r.Value != 0 || m.halt.err != nil || m.epoch != 1 {
		t.Fatalf("skipped meta entry: %+v, halted %v, epoch %d", r, m.halt.err, m.epoch)
	}
}
