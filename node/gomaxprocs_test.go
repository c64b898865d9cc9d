package node

import (
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/lockmesh/lockmesh/internal/procs"
)

// A peer hosting replicas with a low GOMAXPROCS says once what to set;
// a client-only peer, or one whose GOMAXPROCS the environment sets, says
// nothing.
func TestHintGOMAXPROCS(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	runtime.GOMAXPROCS(1)

	hints := func(cfg Config) []slog.Record {
		rec := newLogRecorder()
		n := &Node{cfg: cfg, log: slog.New(rec)}
		n.hintGOMAXPROCS()
		return *rec.records
	}

	t.Setenv("GOMAXPROCS", "")
	got := hints(Config{})
	if len(got) != 1 {
		t.Fatalf("GOMAXPROCS 1: got %d log lines, want 1 hint", len(got))
	}
	msg := got[0].Message
	if !strings.Contains(msg, "set the GOMAXPROCS environment variable") || strings.Contains(msg, "RaiseGOMAXPROCS") {
		t.Errorf("hint %q should say to set GOMAXPROCS and name no removed API", msg)
	}
	var suggested int64
	got[0].Attrs(func(a slog.Attr) bool {
		if a.Key == "suggested" {
			suggested = a.Value.Int64()
		}
		return true
	})
	if suggested != procs.Min {
		t.Errorf("hint suggests %d, want %d", suggested, procs.Min)
	}

	if got := hints(Config{NoReplicas: true}); len(got) != 0 {
		t.Errorf("client-only peer logged %q", got[0].Message)
	}
	t.Setenv("GOMAXPROCS", "1")
	if got := hints(Config{}); len(got) != 0 {
		t.Errorf("GOMAXPROCS set in the environment, yet the peer logged %q", got[0].Message)
	}
}
