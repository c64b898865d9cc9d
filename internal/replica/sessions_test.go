package replica

import (
	"errors"
	"testing"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/lockfsm"
)

func TestSessionsOwnerAndCount(t *testing.T) {
	s := NewLock(LockConfig{Shard: 2, MaxFormat: lockfsm.Version})
	// A session's id is the index of the entry that opened it.
	for i, owner := range []string{"a", "b", "a"} {
		open, _ := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: owner, TTLMillis: 1000}})
		if _, err := s.Update(sm.Entry{Index: uint64(i + 1), Cmd: open}); err != nil {
			t.Fatal(err)
		}
	}
	var shards []uint64
	ss := Sessions{Shard: 2, Read: func(shard uint64, q any) (any, error) {
		shards = append(shards, shard)
		return s.Lookup(q)
	}}
	all := s.state.Sessions()
	if len(all) != 3 {
		t.Fatalf("%d sessions opened, want 3", len(all))
	}
	for _, si := range all {
		if owner, ok := ss.Owner(si.ID); !ok || owner != si.Owner {
			t.Errorf("Owner(%d) = %q, %v; want %q", si.ID, owner, ok, si.Owner)
		}
	}
	if owner, ok := ss.Owner(99); ok {
		t.Errorf("Owner of an unknown session = %q, true", owner)
	}
	if total, owned := ss.Count("a"); total != 3 || owned != 2 {
		t.Errorf("Count(a) = %d, %d; want 3, 2", total, owned)
	}
	if total, owned := ss.Count("c"); total != 3 || owned != 0 {
		t.Errorf("Count(c) = %d, %d; want 3, 0", total, owned)
	}
	for _, shard := range shards {
		if shard != 2 {
			t.Fatalf("read shard %d, want 2", shard)
		}
	}
	// A replica that cannot be read knows no session.
	failing := Sessions{Shard: 2, Read: func(uint64, any) (any, error) { return nil, errors.New("not hosted") }}
	if _, ok := failing.Owner(all[0].ID); ok {
		t.Error("Owner known through a failing read")
	}
	if total, owned := failing.Count("a"); total != 0 || owned != 0 {
		t.Errorf("Count through a failing read = %d, %d", total, owned)
	}
}
