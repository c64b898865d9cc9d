package mesh

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
)

// slogWriter turns memberlist's *log.Logger output ("[LEVEL] memberlist: msg")
// into slog records, so nothing reaches stderr.
type slogWriter struct {
	log *slog.Logger
	// closing is set once the Mesh starts to close (nil: never).
	// memberlist shuts its transport down before it marks itself shut
	// down, so a gossip round in between fails to send on its own closed
	// socket and logs that at ERROR: expected then, and logged at Debug.
	closing *atomic.Bool
}

// Write handles one or more newline-terminated lines. It never fails, so
// memberlist's logger never sees an error.
func (w slogWriter) Write(p []byte) (int, error) {
	for line := range bytes.Lines(p) {
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			continue
		}
		level, msg := parseLogLine(line)
		if isKeyMismatch(msg) {
			// Logged by the peer a mismatched one contacts, at ERROR, as
			// "failed to receive: <reason> from=<addr>": say what it means.
			_, from, _ := strings.Cut(msg, " from=")
			w.log.Warn("mesh: gossip key mismatch: a peer's message cannot be read (its SecretKey differs from this peer's, or one of them has none)",
				"component", "memberlist", "from", from, "detail", msg)
			continue
		}
		if w.closing != nil && w.closing.Load() && strings.Contains(msg, net.ErrClosed.Error()) {
			level = slog.LevelDebug
		}
		if strings.Contains(msg, ErrIncompatible.Error()) {
			// Mesh.admit already warned, rate-limited; memberlist repeats
			// it for every alive message the refused peer sends.
			level = slog.LevelDebug
		}
		if w.log.Enabled(context.Background(), level) {
			w.log.Log(context.Background(), level, msg, "component", "memberlist")
		}
	}
	return len(p), nil
}

// parseLogLine maps memberlist's level prefix to a slog level and strips
// it and the "memberlist: " prefix. Lines without a prefix are Info.
func parseLogLine(line []byte) (slog.Level, string) {
	level := slog.LevelInfo
	if bytes.HasPrefix(line, []byte("[")) {
		if end := bytes.IndexByte(line, ']'); end > 0 {
			switch string(line[1:end]) {
			case "TRACE", "DEBUG":
				level = slog.LevelDebug
			case "INFO":
				level = slog.LevelInfo
			case "WARN", "WARNING":
				level = slog.LevelWarn
			case "ERR", "ERROR":
				level = slog.LevelError
			}
			line = bytes.TrimLeft(line[end+1:], " ")
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	return level, string(line)
}
