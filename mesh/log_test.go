package mesh

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
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

// The peer a mismatched one contacts logs memberlist's decryption failure
// as a warning that says what it means and names the sender.
func TestKeyMismatchLoggedAsSuch(t *testing.T) {
	for _, line := range []string{
		"[ERR] memberlist: failed to receive: No installed keys could decrypt the message from=127.0.0.1:4242",
		"[ERR] memberlist: failed to receive: encryption is configured but remote state is not encrypted from=127.0.0.1:4242",
	} {
		h := &captureHandler{}
		if _, err := (slogWriter{log: slog.New(h)}).Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		if len(h.records) != 1 {
			t.Fatalf("%q: %d records", line, len(h.records))
		}
		r := h.records[0]
		from := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "from" {
				from = a.Value.String()
			}
			return true
		})
		if r.Level != slog.LevelWarn || !strings.Contains(r.Message, "gossip key mismatch") || from != "127.0.0.1:4242" {
			t.Errorf("%q logged as %v %q from %q; want a warning about a gossip key mismatch from 127.0.0.1:4242", line, r.Level, r.Message, from)
		}
	}
}

// memberlist shuts its transport down before it marks itself shut down,
// so a gossip round in between logs a send on its own closed socket at
// ERROR. Once the Mesh is closing that line is Debug; before, it stays
// an error, as any other failed send.
func TestSendOnClosedSocketWhileClosingIsDebug(t *testing.T) {
	const line = "[ERR] memberlist: Failed to send gossip to 127.0.0.1:41813: write udp 127.0.0.1:41605->127.0.0.1:41813: use of closed network connection"
	var closing atomic.Bool
	for _, tc := range []struct {
		closing bool
		want    slog.Level
	}{{false, slog.LevelError}, {true, slog.LevelDebug}} {
		closing.Store(tc.closing)
		h := &captureHandler{}
		if _, err := (slogWriter{log: slog.New(h), closing: &closing}).Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
		if len(h.records) != 1 || h.records[0].Level != tc.want {
			t.Errorf("closing %v: %+v, want one record at %v", tc.closing, h.records, tc.want)
		}
	}
}

// A probe answered only over TCP is a late UDP ack, logged at Info, until
// one peer has had fallbackLimit of them within fallbackWindow: then the
// network is dropping its UDP, and that is a warning. Each peer counts
// alone.
func TestTCPFallbackWarnsOnlyWhenItPersists(t *testing.T) {
	line := func(peer string) []byte {
		return []byte("[WARN] memberlist: Was able to connect to " + peer + " over TCP but UDP probes failed, network may be misconfigured\n")
	}
	h := &captureHandler{}
	w := slogWriter{log: slog.New(h), fallbacks: &probeFallbacks{}}
	for range fallbackLimit - 1 {
		_, _ = w.Write(line("peer-1"))
	}
	_, _ = w.Write(line("peer-2"))
	for i, r := range h.records {
		if r.Level != slog.LevelInfo {
			t.Fatalf("record %d: %v %q, want Info: the fallbacks have not persisted yet", i, r.Level, r.Message)
		}
	}
	_, _ = w.Write(line("peer-1"))
	if last := h.records[len(h.records)-1]; last.Level != slog.LevelWarn {
		t.Fatalf("peer-1's fallback number %d within %v: %v, want Warn", fallbackLimit, fallbackWindow, last.Level)
	}

	// Fallbacks older than the window are forgotten.
	f := &probeFallbacks{}
	start := time.Now()
	for i := range fallbackLimit - 1 {
		f.persistent("p", start.Add(time.Duration(i)*time.Second))
	}
	if f.persistent("p", start.Add(fallbackWindow+time.Hour)) {
		t.Fatal("fallbacks an hour apart counted as persisting")
	}
	// Without a counter every fallback is a warning, as memberlist logs it.
	h = &captureHandler{}
	_, _ = (slogWriter{log: slog.New(h)}).Write(line("peer-3"))
	if len(h.records) != 1 || h.records[0].Level != slog.LevelWarn {
		t.Fatalf("without a counter: %+v, want one Warn", h.records)
	}
}
