package replica

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"

	"github.com/lockmesh/lockmesh/internal/authz"
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
	if ss.Capped() || !(Sessions{RequireCapped: true}).Capped() {
		t.Error("Capped does not answer RequireCapped")
	}
}

// The accept-time check of the session caps reads the counts the state
// keeps: the flood of the review, one proposal of 4,096 OpenSessions on a
// shard of 16,384 sessions, is checked in milliseconds. It took 24 s and
// 4.1 GiB when each open's check read and sorted the session table.
func TestAcceptCheckOfSessionCapsCostsO1(t *testing.T) {
	s := NewLock(LockConfig{Shard: 2, MaxFormat: lockfsm.Version})
	for i := range uint64(4) {
		var cmds []lockfsm.Command
		for j := range lockfsm.MaxBatch {
			cmds = append(cmds, lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: fmt.Sprint("peer-", j%8), TTLMillis: 60_000})
		}
		raw, err := lockfsm.EncodeCommands(cmds)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Update(sm.Entry{Index: i + 1, Cmd: raw}); err != nil {
			t.Fatal(err)
		}
	}
	ss := Sessions{Shard: 2, Read: func(_ uint64, q any) (any, error) { return s.Lookup(q) }}
	// An owner each (an anonymous caller may name any), so the counts are
	// read for every open.
	var flood []lockfsm.Command
	for i := range lockfsm.MaxBatch {
		flood = append(flood, lockfsm.Command{Op: lockfsm.OpOpenSession, Owner: fmt.Sprint("mallory-", i), TTLMillis: 60_000})
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	err := authz.Commands(authz.Caller{}, flood, ss)
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("%d opens of new owners refused: %v", len(flood), err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("accept-time check of %d opens on a shard of %d sessions: %v, %d KiB and %d allocations",
		len(flood), 4*lockfsm.MaxBatch, took, alloc>>10, after.Mallocs-before.Mallocs)
	if alloc > 4<<20 || took > time.Second {
		t.Errorf("%v and %d bytes to check %d opens: more than O(1) each", took, alloc, len(flood))
	}
}
