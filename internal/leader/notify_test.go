package leader

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/lockmesh/lockmesh/internal/client"
	"github.com/lockmesh/lockmesh/lockfsm"
)

func grant(owner string, session, token uint64) lockfsm.Grant {
	return lockfsm.Grant{Key: "k", Session: session, Req: 1, Token: token, Owner: owner, HandOff: true}
}

// Who learns of a grant an entry made, and how: this peer's own waiters
// from its replica's apply, with the token; owners that host no replica
// of the shard from a notice the leader pushes; nobody else (a peer with
// a replica learns from its own apply).
func TestOnApplyGrants(t *testing.T) {
	for _, c := range []struct {
		name     string
		leads    bool
		noLayout bool
		owner    string
		woken    bool // this peer's waiter gets the token
		notified bool // a notice is queued for owner
	}{
		{name: "own grant, as a follower", owner: "a", woken: true},
		{name: "own grant, as the leader", leads: true, owner: "a", woken: true},
		{name: "owner without a replica, as the leader", leads: true, owner: "d", notified: true},
		{name: "owner without a replica, as a follower", owner: "d"},
		{name: "owner with a replica, as the leader", leads: true, owner: "b"},
		{name: "no layout yet, as the leader", leads: true, noLayout: true, owner: "b", notified: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			if c.leads {
				f.elect(shard, 3)
			}
			if c.noLayout {
				f.h.p = nil
			}
			key := client.WaiterKey{Shard: shard, Session: 7, Req: 1}
			woke := f.waiters.Add(key)
			f.s.OnApplyGrants(shard, []lockfsm.Grant{grant(c.owner, 7, 42)})
			select {
			case token := <-woke:
				if !c.woken || token != 42 {
					t.Fatalf("waiter woken with %d; want woken %v with token 42", token, c.woken)
				}
			default:
				if c.woken {
					t.Fatal("waiter not woken")
				}
			}
			select {
			case j := <-f.s.notifyQ:
				if !c.notified || j != (notifyJob{owner: c.owner, shard: shard, grant: grant(c.owner, 7, 42)}) {
					t.Fatalf("queued %+v; want notified %v", j, c.notified)
				}
			default:
				if c.notified {
					t.Fatal("no notice queued")
				}
			}
		})
	}
}

// A notice wakes only this peer's waiters, and only to verify: it carries
// no token anyone may rely on.
func TestOnNoticeWakesOnlyToVerify(t *testing.T) {
	f := newFixture(t)
	mine := client.WaiterKey{Shard: shard, Session: 7, Req: 1}
	theirs := client.WaiterKey{Shard: shard, Session: 8, Req: 1}
	wokeMine, wokeTheirs := f.waiters.Add(mine), f.waiters.Add(theirs)
	f.s.OnNotice(Notice{Shard: shard, Grants: []lockfsm.Grant{grant("a", 7, 42), grant("b", 8, 43)}})
	select {
	case token := <-wokeMine:
		if token != client.Verify {
			t.Fatalf("notice woke the waiter with token %d, want Verify", token)
		}
	default:
		t.Fatal("notice did not wake this peer's waiter")
	}
	select {
	case token := <-wokeTheirs:
		t.Fatalf("a grant naming another owner woke a waiter here with %d", token)
	default:
	}
}

// runLoop runs the notice loop until the test ends.
func (f *fixture) runLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	f.s.goFunc(func() {
		f.s.notifyLoop(ctx)
		close(done)
	})
	t.Cleanup(func() {
		cancel()
		<-done
		f.s.wg.Wait()
	})
}

// Queued grants go out as one call per owner and shard, in the order they
// were granted; an owner without an address is skipped.
func TestNoticesAreBatchedPerOwnerAndShard(t *testing.T) {
	f := newFixture(t)
	f.elect(shard, 3)
	f.elect(shard+1, 3)
	f.s.OnApplyGrants(shard, []lockfsm.Grant{grant("d", 1, 10), grant("e", 2, 11), grant("x", 3, 12)})
	f.s.OnApplyGrants(shard+1, []lockfsm.Grant{grant("d", 4, 20)})
	f.s.OnApplyGrants(shard, []lockfsm.Grant{grant("d", 5, 13)})
	f.runLoop(t)
	waitFor(t, "three notices sent", func() bool { return len(f.h.sent()) >= 3 })

	got := map[string][]uint64{} // addr/shard -> tokens
	for _, n := range f.h.sent() {
		if n.method != notifyMethod {
			t.Fatalf("notice sent with method %d, want %d", n.method, notifyMethod)
		}
		var nt Notice
		if err := msgpack.Unmarshal(n.body, &nt); err != nil {
			t.Fatal(err)
		}
		dest := fmt.Sprintf("%s/%d", n.addr, nt.Shard)
		if _, dup := got[dest]; dup {
			t.Fatalf("two notices to %s", dest)
		}
		for _, g := range nt.Grants {
			got[dest] = append(got[dest], g.Token)
		}
	}
	want := map[string][]uint64{
		fmt.Sprintf("addr-d/%d", shard):   {10, 13},
		fmt.Sprintf("addr-e/%d", shard):   {11},
		fmt.Sprintf("addr-d/%d", shard+1): {20},
	}
	if len(got) != len(want) {
		t.Fatalf("notices %v, want %v", got, want)
	}
	for dest, tokens := range want {
		if !slices.Equal(got[dest], tokens) {
			t.Fatalf("notices %v, want %v", got, want)
		}
	}
}

// At most maxNotifyCalls notices are pushed at once, so slow owners cannot
// pile up goroutines on the leader.
func TestNoticesInFlightAreCapped(t *testing.T) {
	f := newFixture(t)
	f.elect(shard, 3)
	const owners = maxNotifyCalls + 20
	var (
		mu             sync.Mutex
		inFlight, most int
	)
	release := make(chan struct{})
	f.h.call = func(ctx context.Context, _ notice) error {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		select {
		case <-release:
		case <-ctx.Done():
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		return ctx.Err()
	}
	for i := range owners {
		f.s.OnApplyGrants(shard, []lockfsm.Grant{grant(fmt.Sprint("owner-", i), uint64(i+1), uint64(i+1))})
	}
	f.runLoop(t)
	for released := 0; released < owners; released++ {
		waitFor(t, "notices in flight", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return inFlight == min(maxNotifyCalls, owners-released)
		})
		release <- struct{}{}
	}
	waitFor(t, "every notice settled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return inFlight == 0
	})
	if n := len(f.h.sent()); most != maxNotifyCalls || n != owners {
		t.Fatalf("at most %d notices in flight, %d sent; want %d, %d", most, n, maxNotifyCalls, owners)
	}
}

// A full queue drops notices instead of blocking dragonboat's apply
// goroutine: the waiters' slow re-read finds those grants.
func TestFullNoticeQueueDropsNotices(t *testing.T) {
	f := newFixture(t)
	f.elect(shard, 3)
	grants := make([]lockfsm.Grant, notifyQueue+10)
	for i := range grants {
		grants[i] = grant(strings.Repeat("d", 1+i%3), uint64(i+1), uint64(i+1))
	}
	f.s.OnApplyGrants(shard, grants) // the loop is not running: nothing drains the queue
	if n := len(f.s.notifyQ); n != notifyQueue {
		t.Fatalf("%d notices queued, want the queue's %d", n, notifyQueue)
	}
}
