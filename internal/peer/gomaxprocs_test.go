package peer

import (
	"context"
	"log/slog"
	"runtime"
	"strings"
	"sync"
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
		rec := &records{}
		n := &Peer{cfg: cfg, log: slog.New(rec)}
		n.hintGOMAXPROCS()
		return rec.all
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

// records is a slog.Handler that keeps every record.
type records struct {
	mu  sync.Mutex
	all []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }

func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rec.Clone())
	return nil
}
