package mesh

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseLogLine(t *testing.T) {
	for _, c := range []struct {
		in    string
		level slog.Level
		msg   string
	}{
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:1", slog.LevelDebug, "Stream connection from=127.0.0.1:1"},
		{"[INFO] memberlist: Suspect b has failed", slog.LevelInfo, "Suspect b has failed"},
		{"[WARN] memberlist: Was able to connect", slog.LevelWarn, "Was able to connect"},
		{"[ERR] memberlist: Failed to receive", slog.LevelError, "Failed to receive"},
		{"[ERROR] memberlist: x", slog.LevelError, "x"},
		{"no prefix", slog.LevelInfo, "no prefix"},
		{"[", slog.LevelInfo, "["},
	} {
		level, msg := parseLogLine([]byte(c.in))
		if level != c.level || msg != c.msg {
			t.Errorf("parseLogLine(%q) = %v %q, want %v %q", c.in, level, msg, c.level, c.msg)
		}
	}
}

// captureHandler keeps every record it is given.
type captureHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *captureHandler) WithGroup(string) slog.Handler      { return h }

// memberlist's own log lines arrive as slog records, levels parsed: a
// stream carrying a refused message makes memberlist log the connection at
// debug level and the refusal at error level.
func TestMemberlistLogsGoThroughSlog(t *testing.T) {
	h := &captureHandler{}
	m, err := Create(Config{Name: "logger", BindAddr: "127.0.0.1:0", Local: true, Logger: slog.New(h)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sendStream(t, m.Addr(), encodeMsg(t, tPushPull, pushPullHeader{Nodes: 1 << 20}))
	seen := func() (debug, refusal bool) {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, r := range h.records {
			if strings.HasPrefix(r.Message, "[") {
				t.Errorf("level prefix left in message %q", r.Message)
			}
			if r.Level == slog.LevelDebug && strings.HasPrefix(r.Message, "Stream connection") {
				debug = true
			}
			if r.Level == slog.LevelError && strings.Contains(r.Message, "gossip message refused") {
				refusal = true
			}
		}
		return debug, refusal
	}
	waitFor(t, 10*time.Second, "memberlist's debug line about the stream and its error line about the refusal", func() bool {
		debug, refusal := seen()
		return debug && refusal
	})
}
