package node

import (
	"runtime"
	"testing"
)

func TestRaiseGOMAXPROCS(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)

	t.Setenv("GOMAXPROCS", "1")
	runtime.GOMAXPROCS(1)
	if got := RaiseGOMAXPROCS(); got != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("with GOMAXPROCS set in the environment: got %d, in effect %d; want 1 left alone", got, runtime.GOMAXPROCS(0))
	}
	t.Setenv("GOMAXPROCS", "")
	if got := RaiseGOMAXPROCS(); got != MinGOMAXPROCS || runtime.GOMAXPROCS(0) != MinGOMAXPROCS {
		t.Fatalf("got %d, in effect %d; want %d", got, runtime.GOMAXPROCS(0), MinGOMAXPROCS)
	}
	runtime.GOMAXPROCS(MinGOMAXPROCS + 4)
	if got := RaiseGOMAXPROCS(); got != MinGOMAXPROCS+4 {
		t.Fatalf("a higher GOMAXPROCS was changed to %d", got)
	}
}
