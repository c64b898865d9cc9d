package gocronlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/lockmesh/lockmesh/adapters/gocronlock"
)

// skipMonitor reports the runs gocron skipped, by scheduler.
type skipMonitor struct {
	k       int
	skipped chan<- int
}

func (m skipMonitor) IncrementJob(_ uuid.UUID, _ string, _ []string, status gocron.JobStatus) {
	if status == gocron.Skip {
		select {
		case m.skipped <- m.k:
		default:
		}
	}
}

func (skipMonitor) RecordJobTiming(time.Time, time.Time, uuid.UUID, string, []string) {}

// await reads ch until it has seen k n times, or fails the test when ctx
// ends.
func await(t *testing.T, ctx context.Context, ch <-chan int, k, n int, what string) {
	t.Helper()
	for seen := 0; seen < n; {
		select {
		case got := <-ch:
			if got == k {
				seen++
			}
		case <-ctx.Done():
			t.Fatalf("%s: saw %d of %d in time", what, seen, n)
		}
	}
}

// Two real gocron schedulers, each with the same job every 100 ms and an
// Elector of one election: the job runs only on the leader's scheduler,
// the other's runs are skipped; once the leader closes its Elector, the
// job runs on the other scheduler, in a later term, and never again on
// the first.
func TestSchedulerRunsOnlyOnLeader(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 18*time.Second)
	els := []*gocronlock.Elector{
		newElector(t, newSession(t, n), "election/cron", "a"),
		newElector(t, newSession(t, n), "election/cron", "b"),
	}
	leader, ld := firstLeader(t, ctx, els...)
	follower := 1 - leader

	var (
		mu       sync.Mutex
		invoked  [2]int      // runs the job function saw, by scheduler
		accepted [2][]uint64 // terms of the runs that found their Elector leading
	)
	ran := make(chan int, 1024)     // a scheduler's run found itself leading
	skipped := make(chan int, 1024) // a scheduler's run was skipped
	for k, el := range els {
		s, err := gocron.NewScheduler(
			gocron.WithDistributedElector(el),
			gocron.WithMonitor(skipMonitor{k, skipped}),
		)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Shutdown() })
		_, err = s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() {
			mu.Lock()
			defer mu.Unlock()
			invoked[k]++
			// As a real job does: take the term to fence what it writes.
			if ld, err := el.Leadership(); err == nil {
				accepted[k] = append(accepted[k], ld.Term())
				select {
				case ran <- k:
				default:
				}
			}
		}), gocron.WithName("tick"))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
	}

	await(t, ctx, ran, leader, 3, "runs on the leader")
	await(t, ctx, skipped, follower, 3, "skipped runs on the follower")
	mu.Lock()
	if invoked[follower] != 0 {
		t.Errorf("the job ran %d times on the follower's scheduler", invoked[follower])
	}
	for _, term := range accepted[leader] {
		if term != ld.Term() {
			t.Errorf("a run on the leader in term %d, want %d", term, ld.Term())
		}
	}
	mu.Unlock()

	if err := els[leader].Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	before := len(accepted[leader])
	mu.Unlock()
	await(t, ctx, ran, follower, 3, "runs on the new leader")
	await(t, ctx, skipped, leader, 3, "skipped runs on the old leader")
	mu.Lock()
	defer mu.Unlock()
	if after := len(accepted[leader]); after != before {
		t.Errorf("the old leader's job found itself leading %d times after Close", after-before)
	}
	for _, term := range accepted[follower] {
		if term <= ld.Term() {
			t.Errorf("a run on the new leader in term %d, not after the old term %d", term, ld.Term())
		}
	}
}

// Two real gocron schedulers with a Locker each, on two Sessions: while a
// run holds the job's lock, every other run, on either scheduler, is
// skipped with ErrJobLocked; once it ends, the job runs again.
func TestSchedulerLockerSkipsWhileRunning(t *testing.T) {
	n := startPeer(t)
	ctx := testCtx(t, 18*time.Second)

	var (
		mu      sync.Mutex
		running int     // runs going on, on either scheduler
		most    int     // the most that ever went on at once
		others  []error // lock errors that were not ErrJobLocked
	)
	started := make(chan int, 1024) // a scheduler's run began
	refused := make(chan int, 1024) // a scheduler's run was refused its lock
	release := make(chan struct{})  // lets the first run end
	var once sync.Once
	defer once.Do(func() { close(release) })
	for k := range 2 {
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(
			gocronlock.NewLocker(newSession(t, n), gocronlock.WithKeyPrefix("cron/"))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Shutdown() })
		_, err = s.NewJob(gocron.DurationJob(100*time.Millisecond), gocron.NewTask(func() {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			started <- k
			<-release
			mu.Lock()
			running--
			mu.Unlock()
		}), gocron.WithName("tick"), gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, _ string, err error) {
			if !errors.Is(err, gocronlock.ErrJobLocked) {
				// Checked when the test's body ends: the schedulers'
				// shutdown cancels a Lock in flight, which is no fault.
				mu.Lock()
				others = append(others, err)
				mu.Unlock()
				return
			}
			select {
			case refused <- k:
			default:
			}
		})))
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
	}

	var first int
	select {
	case first = <-started:
	case <-ctx.Done():
		t.Fatal("the job never ran")
	}
	// Both schedulers tick on while the first run holds the lock.
	await(t, ctx, refused, 1-first, 3, "refused runs on the other scheduler")
	await(t, ctx, refused, first, 3, "refused runs on the first run's scheduler")
	mu.Lock()
	if most != 1 {
		t.Errorf("%d runs went on at once, want 1", most)
	}
	mu.Unlock()
	once.Do(func() { close(release) })
	select {
	case <-started: // a later run, on either scheduler, got the lock
	case <-ctx.Done():
		t.Fatal("the job did not run again after the first run ended")
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Errorf("%d runs went on at once, want 1", most)
	}
	for _, err := range others {
		t.Errorf("a lock error that is not ErrJobLocked: %v", err)
	}
}
