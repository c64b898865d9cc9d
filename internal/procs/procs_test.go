package procs

import (
	"runtime"
	"testing"
)

func TestRaise(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)

	t.Setenv("GOMAXPROCS", "1")
	runtime.GOMAXPROCS(1)
	if _, low := Low(); low {
		t.Fatal("Low reports 1 as low although GOMAXPROCS is set in the environment")
	}
	if got := Raise(); got != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("with GOMAXPROCS set in the environment: got %d, in effect %d; want 1 left alone", got, runtime.GOMAXPROCS(0))
	}
	t.Setenv("GOMAXPROCS", "")
	if cur, low := Low(); cur != 1 || !low {
		t.Fatalf("Low() = %d, %v; want 1, true", cur, low)
	}
	if got := Raise(); got != Min || runtime.GOMAXPROCS(0) != Min {
		t.Fatalf("got %d, in effect %d; want %d", got, runtime.GOMAXPROCS(0), Min)
	}
	runtime.GOMAXPROCS(Min + 4)
	if got := Raise(); got != Min+4 || runtime.GOMAXPROCS(0) != Min+4 {
		t.Fatalf("a higher GOMAXPROCS was changed to %d", got)
	}
	if _, low := Low(); low {
		t.Fatalf("Low reports %d as low", Min+4)
	}
}
