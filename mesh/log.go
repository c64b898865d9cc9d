package mesh

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	// fallbacks counts probes answered only over TCP (nil: every one is
	// a warning, as memberlist logs it).
	fallbacks *probeFallbacks
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
		if peer, ok := tcpFallback(msg); ok && w.fallbacks != nil && !w.fallbacks.persistent(peer, time.Now()) {
			// One late UDP ack on a loaded machine: memberlist reached
			// the peer over TCP. Only a peer whose UDP probes keep
			// failing points at the network (a firewall dropping UDP).
			level = slog.LevelInfo
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

// tcpFallback reports whether msg is memberlist's line for a probe that
// got no UDP ack but reached the peer over TCP, and names the peer.
func tcpFallback(msg string) (peer string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "Was able to connect to ")
	if !ok {
		return "", false
	}
	peer, _, ok = strings.Cut(rest, " over TCP but UDP probes failed")
	return peer, ok
}

// Probes answered only over TCP count as a network problem once a peer
// has fallbackLimit of them within fallbackWindow: memberlist probes each
// peer about once per member per second, so a peer whose UDP is dropped
// gets there within seconds.
const (
	fallbackLimit  = 3
	fallbackWindow = time.Minute
)

// probeFallbacks keeps, per peer, when its last probes were answered only
// over TCP.
type probeFallbacks struct {
	mu   sync.Mutex
	seen map[string][]time.Time
}

// persistent records a TCP-only probe of peer at now and reports whether
// the peer has had fallbackLimit of them within fallbackWindow.
func (f *probeFallbacks) persistent(peer string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[string][]time.Time{}
	}
	recent := append(f.seen[peer], now)
	for len(recent) > 0 && now.Sub(recent[0]) > fallbackWindow {
		recent = recent[1:]
	}
	if len(recent) > fallbackLimit {
		recent = recent[len(recent)-fallbackLimit:]
	}
	f.seen[peer] = recent
	return len(recent) >= fallbackLimit
}
