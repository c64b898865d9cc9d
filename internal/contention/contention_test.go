package contention

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)

func TestGrantAgeDatesATokenByTheFirstSampleThatReachesIt(t *testing.T) {
	tr := New(t0)
	tr.Granted(t0, 5, false)
	tr.Granted(t0.Add(time.Second), 9, false)
	now := t0.Add(3 * time.Second)
	for _, c := range []struct {
		token uint64
		want  Age
	}{
		{1, Age{Dur: 3 * time.Second, Known: true}},
		{5, Age{Dur: 3 * time.Second, Known: true}},
		{6, Age{Dur: 2 * time.Second, Known: true}},
		{9, Age{Dur: 2 * time.Second, Known: true}},
		{10, Age{}}, // not granted yet as far as the tracker knows
	} {
		if got := tr.GrantAge(now, c.token); got != c.want {
			t.Errorf("GrantAge(token %d) = %+v, want %+v", c.token, got, c.want)
		}
	}
}

func TestGrantsWithinTheGapShareTheEarlierTime(t *testing.T) {
	tr := New(t0)
	tr.Granted(t0, 5, false)
	tr.Granted(t0.Add(SampleGap/2), 6, false)
	if got := tr.GrantAge(t0.Add(time.Second), 6); got.Dur != time.Second {
		t.Fatalf("token 6 dated %v ago, want 1s (the earlier grant's time)", got.Dur)
	}
	if len(tr.samples) != 1 {
		t.Fatalf("%d samples, want 1", len(tr.samples))
	}
}

func TestLateAndLoadedGrantsAreAtLeast(t *testing.T) {
	tr := New(t0)
	tr.Loaded(t0, 100)
	tr.Granted(t0.Add(time.Second), 110, true)
	tr.Granted(t0.Add(2*time.Second), 120, false)
	now := t0.Add(10 * time.Second)
	for _, c := range []struct {
		token uint64
		want  Age
	}{
		{50, Age{Dur: 10 * time.Second, AtLeast: true, Known: true}},
		{105, Age{Dur: 9 * time.Second, AtLeast: true, Known: true}},
		{115, Age{Dur: 8 * time.Second, Known: true}},
	} {
		if got := tr.GrantAge(now, c.token); got != c.want {
			t.Errorf("GrantAge(token %d) = %+v, want %+v", c.token, got, c.want)
		}
	}
}

// TestMergedSamplesKeepAgesLowerBoundsWithinAFewPercent grants one token a
// second for a day, far more than MaxSamples, and checks every token's age:
// never more than the truth (ages stay lower bounds), and short of it by at
// most a few percent of itself plus the gap.
func TestMergedSamplesKeepAgesLowerBoundsWithinAFewPercent(t *testing.T) {
	tr := New(t0)
	const n = 86400
	for i := range n {
		tr.Granted(t0.Add(time.Duration(i)*time.Second), uint64(i+1), false)
	}
	if len(tr.samples) > MaxSamples {
		t.Fatalf("%d samples, bound %d", len(tr.samples), MaxSamples)
	}
	now := t0.Add(n * time.Second)
	worst := 0.0
	for tok := uint64(1); tok <= n; tok += 7 {
		truth := now.Sub(t0.Add(time.Duration(tok-1) * time.Second))
		got := tr.GrantAge(now, tok)
		if !got.Known || got.AtLeast {
			t.Fatalf("token %d: %+v", tok, got)
		}
		if got.Dur > truth {
			t.Fatalf("token %d dated %v ago, more than the true %v", tok, got.Dur, truth)
		}
		short := float64(truth-got.Dur) / float64(truth+time.Second)
		worst = max(worst, short)
	}
	if worst > 0.10 {
		t.Fatalf("an age fell short of the truth by %.1f%% of it, want at most 10%%", 100*worst)
	}
	t.Logf("worst shortfall %.2f%% with %d samples", 100*worst, len(tr.samples))
}

func TestWaitAges(t *testing.T) {
	tr := New(t0)
	never := func(Attempt) bool { t.Fatal("pruned below the bound"); return false }
	a, b := Attempt{1, 1}, Attempt{2, 1}
	tr.Queued(t0, a, false, never)
	tr.Queued(t0.Add(time.Second), b, true, never)
	now := t0.Add(5 * time.Second)
	if got := tr.WaitAge(now, a); got != (Age{Dur: 5 * time.Second, Known: true}) {
		t.Errorf("a: %+v", got)
	}
	if got := tr.WaitAge(now, b); got != (Age{Dur: 4 * time.Second, AtLeast: true, Known: true}) {
		t.Errorf("b: %+v", got)
	}
	tr.HandedOff(now, a, "k")
	tr.Left(b)
	if got := tr.WaitAge(now, a); got.Known {
		t.Errorf("a still waits after its hand-off: %+v", got)
	}
	if got := tr.WaitAge(now, b); got.Known {
		t.Errorf("b still waits after it left: %+v", got)
	}
	if got := tr.Keys(); len(got) != 1 || got[0] != (KeyStat{Key: "k", Handoffs: 1, Wait: 5 * time.Second}) {
		t.Errorf("Keys = %+v", got)
	}
}

func TestQueueTimesAreBounded(t *testing.T) {
	tr := New(t0)
	gone := map[Attempt]bool{}
	waiting := func(a Attempt) bool { return !gone[a] }
	for i := range uint64(MaxQueued) {
		tr.Queued(t0, Attempt{i, 1}, false, waiting)
	}
	// Full, and every waiter still waits: a new one is not kept.
	tr.Queued(t0, Attempt{1 << 40, 1}, false, waiting)
	if got := tr.WaitAge(t0, Attempt{1 << 40, 1}); got.Known {
		t.Fatalf("a waiter beyond the bound was kept")
	}
	// Half of them left unseen (a session expired): they make room.
	for i := range uint64(MaxQueued / 2) {
		gone[Attempt{i, 1}] = true
	}
	tr.Queued(t0, Attempt{1 << 41, 1}, false, waiting)
	if got := tr.WaitAge(t0, Attempt{1 << 41, 1}); !got.Known {
		t.Fatalf("no room made for a new waiter")
	}
	if n := len(tr.queued); n != MaxQueued/2+1 {
		t.Fatalf("%d queue times kept, want %d", n, MaxQueued/2+1)
	}
}

// TestSummaryKeepsTheMostWaitedForKeys feeds one heavy key among many light
// ones, more keys than the summary holds, and checks space-saving's
// guarantees: the heavy key is in it, first, and every entry brackets its
// key's true wait between Wait-Overcount and Wait.
func TestSummaryKeepsTheMostWaitedForKeys(t *testing.T) {
	tr := New(t0)
	rng := rand.New(rand.NewPCG(1, 2))
	truth := map[string]time.Duration{}
	for i := range 20000 {
		key := fmt.Sprintf("light/%d", rng.IntN(1000))
		wait := time.Duration(rng.IntN(10)) * time.Millisecond
		if i%10 == 0 {
			key, wait = "heavy", 50*time.Millisecond
		}
		a := Attempt{uint64(i), 1}
		tr.Queued(t0, a, false, func(Attempt) bool { return true })
		tr.HandedOff(t0.Add(wait), a, key)
		truth[key] += wait
	}
	keys := tr.Keys()
	if len(keys) != MaxKeys {
		t.Fatalf("%d keys in the summary, want %d", len(keys), MaxKeys)
	}
	if keys[0].Key != "heavy" {
		t.Fatalf("first key %q, want heavy", keys[0].Key)
	}
	for _, k := range keys {
		if tw := truth[k.Key]; tw > k.Wait || tw < k.Wait-k.Overcount {
			t.Errorf("%s: true wait %v outside [%v, %v]", k.Key, tw, k.Wait-k.Overcount, k.Wait)
		}
	}
}
