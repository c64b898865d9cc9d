package gocronlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/adapters/gocronlock"
	"github.com/lockmesh/lockmesh/node"
)

// Two instances' lockers: the second cannot lock a job the first holds,
// and is told who holds it; it can once the first unlocks.
func TestLockerSkipsWhileHeld(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	l1 := gocronlock.NewLocker(newSession(t, n), gocronlock.WithKeyPrefix("cron/"))
	l2 := gocronlock.NewLocker(newSession(t, n), gocronlock.WithKeyPrefix("cron/"))

	lk1, err := l1.Lock(ctx, "report")
	if err != nil {
		t.Fatalf("first Lock: %v", err)
	}
	_, err = l2.Lock(ctx, "report")
	if !errors.Is(err, gocronlock.ErrJobLocked) || !errors.Is(err, node.ErrLocked) {
		t.Fatalf("second Lock while held: %v, want ErrJobLocked wrapping node.ErrLocked", err)
	}
	if le, ok := errors.AsType[*node.LockedError](err); !ok || le.Key != "cron/report" || len(le.Holders) != 1 {
		t.Fatalf("second Lock's error %v: want a *node.LockedError of cron/report naming one holder", err)
	}
	if info, err := n.Inspect(ctx, "cron/report"); err != nil || len(info.Holders) != 1 {
		t.Fatalf("Inspect(cron/report) = %+v, %v: want the key held under the prefix", info, err)
	}

	if err := lk1.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	lk2, err := l2.Lock(ctx, "report")
	if err != nil {
		t.Fatalf("second Lock after Unlock: %v", err)
	}
	if err := lk2.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
}

// A run still going on a Session holds its job's lock: the next run
// through the same Session is skipped too, not refused as a misuse.
func TestLockerSameSessionSkips(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	l := gocronlock.NewLocker(newSession(t, n))
	lk, err := l.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	if _, err := l.Lock(ctx, "report"); !errors.Is(err, gocronlock.ErrJobLocked) || !errors.Is(err, node.ErrAlreadyHeld) {
		t.Fatalf("second Lock through the same Session: %v, want ErrJobLocked wrapping node.ErrAlreadyHeld", err)
	}
}

// The node's default sessions are a TryLocker too; a key the node refuses
// comes back as it refused it, not as a held job.
func TestLockerNodeAndInvalidKey(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	l := gocronlock.NewLocker(n)
	if _, err := l.Lock(ctx, ""); !errors.Is(err, node.ErrInvalidKey) || errors.Is(err, gocronlock.ErrJobLocked) {
		t.Fatalf("Lock of an empty key: %v, want node.ErrInvalidKey only", err)
	}
	lk, err := l.Lock(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gocronlock.NewLocker(newSession(t, n)).Lock(ctx, "report"); !errors.Is(err, gocronlock.ErrJobLocked) {
		t.Fatalf("Lock through a Session of a key the node holds: %v, want ErrJobLocked", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// gocron unlocks with the job's context, which is cancelled when the
// scheduler shuts down mid-run: the release still commits.
func TestLockerUnlockAfterJobContextEnded(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 15*time.Second)
	l1 := gocronlock.NewLocker(newSession(t, n))
	l2 := gocronlock.NewLocker(newSession(t, n))
	jobCtx, cancel := context.WithCancel(ctx)
	lk, err := l1.Lock(jobCtx, "report")
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := lk.Unlock(jobCtx); err != nil {
		t.Fatalf("Unlock with a cancelled context: %v, want the release committed", err)
	}
	lk2, err := l2.Lock(ctx, "report")
	if err != nil {
		t.Fatalf("Lock after the release: %v", err)
	}
	lk2.Unlock(ctx)
}
