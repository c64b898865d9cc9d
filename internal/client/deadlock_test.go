package client

import (
	"errors"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// eventually polls cond until it holds; a condition still false after a
// minute is a failure, not a hang until the test binary's timeout.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after a minute", what)
		}
	}
}

// waitListed waits until n flagged waits are registered.
func waitListed(t *testing.T, c *Client, n int) {
	t.Helper()
	eventually(t, "listed", func() bool {
		c.waits.mu.Lock()
		defer c.waits.mu.Unlock()
		return len(c.waits.m) >= n
	})
}

// A flagged wait is listed for the cross-shard check only when its Session
// holds a lock (an Session that holds nothing is in no cycle), and a refusal
// ends the wait with its error and withdraws the attempt from the queue:
// the key's release later grants nobody of it.
func TestRefusedWaitLeavesTheQueue(t *testing.T) {
	pc := newPromiseClient(t)
	o1, o2, o3 := mustSession(t, pc.Client), mustSession(t, pc.Client), mustSession(t, pc.Client)
	x, _, err := o1.Acquire(pc.ctx, 2, "x", true, detail)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := o2.Acquire(pc.ctx, 2, "y", true, detail); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 2)
	go func() {
		_, _, err := o2.Acquire(pc.ctx, 2, "x", true, detail)
		got <- err
	}()
	waitListed(t, pc.Client, 1)
	go func() {
		h, _, err := o3.Acquire(pc.ctx, 2, "x", true, detail)
		if err == nil {
			err = h.Unlock(pc.ctx)
		}
		got <- err
	}()
	waitListed(t, pc.Client, 2)

	waits := pc.Waits().Older(time.Now().Add(time.Hour))
	if len(waits) != 1 || waits[0].Key != "x" {
		t.Fatalf("listed %+v, want only the wait of the Session that holds y", waits)
	}
	if pc.Waits().Refuse(WaiterKey{Shard: 2, Session: 99, Req: 1}, errors.New("x")) {
		t.Fatal("refused a wait that is not listed")
	}
	refusal := errors.Join(lockerr.Deadlock, errors.New("the test's cycle"))
	if !pc.Waits().Refuse(waits[0].WaiterKey, refusal) {
		t.Fatal("the listed wait was not refused")
	}
	if err := <-got; !errors.Is(err, lockerr.Deadlock) {
		t.Fatalf("the refused wait returned %v, want the refusal", err)
	}
	// Withdrawn: x's release goes to o3, behind it.
	eventually(t, "withdrawn", func() bool {
		pc.cluster.stateCluster.mu.Lock()
		defer pc.cluster.stateCluster.mu.Unlock()
		info, _ := pc.cluster.s.Request(waits[0].Session, waits[0].Req)
		return info.State == lockfsm.ReqCancelled
	})
	if err := x.Unlock(pc.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the wait behind the refused one: %v", err)
	}
}
