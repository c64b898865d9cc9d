package node

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/lockmesh/lockmesh/internal/dblog"
)

// captureDragonboatLog routes dragonboat's log to l for the rest of the
// test. dragonboat's logger factory is process-wide and installed once,
// writing through the logger of the first node started in the process;
// this swaps that logger and puts the old one back at cleanup.
func captureDragonboatLog(t *testing.T, l *slog.Logger) {
	dblog.Install(l)
	old := dblog.SwapForTest(l)
	t.Cleanup(func() { dblog.SwapForTest(old) })
}

// expectedWarnings are the warnings a healthy plaintext test cluster may
// log: lockmesh's own start-up warning about running without encryption
// (once per start, as intended: an operator should fix it), and
// memberlist's when a restarted peer tells the others it is alive again
// (logged by memberlist, routed by package mesh).
var expectedWarnings = []string{
	"running without encryption or peer authentication",
	"Refuting a dead message",
}

// A healthy cluster with lock traffic, a leader transfer and a peer
// restart logs no dragonboat warning or error: WARN is for what an
// operator must act on. Elections are still logged, at Info.
func TestHealthyClusterLogsNoWarnings(t *testing.T) {
	rec := newLogRecorder()
	l := slog.New(rec)
	captureDragonboatLog(t, l)
	// A TTL of 300 RTT: a leader's Close (about 200ms) plus an election
	// must not expire the other peers' sessions, as they do not at the
	// defaults (100 RTT, but 10s).
	peers := startClusterWith(t, clusterOpts{peers: 3, rf: 3, ttl: 3 * time.Second}, func(_ int, c *Config) { c.Logger = l })
	ctx := ctxT(t, 60*time.Second)
	const key = "warn/0"

	var wg sync.WaitGroup
	stop := make(chan struct{})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	// Lock traffic from the two peers that stay up.
	for _, p := range peers[:2] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				lk, err := p.node.Lock(ctx, fmt.Sprintf("warn/%d", j%8))
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(5 * time.Millisecond)
				if err := lk.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	time.Sleep(3 * time.Second)

	// Hand the key's shard to peer-3, then restart peer-3: a leader
	// transfer, then an election.
	n, last := peers[0].node, peers[2]
	pl := n.peer.Placement()
	shard := pl.ShardOf(key)
	target, ok := pl.ReplicaID(shard, last.cfg.Name)
	if !ok {
		t.Fatalf("%s hosts no replica of shard %d", last.cfg.Name, shard)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if id, _, ok, err := n.peer.NodeHost().GetLeaderID(shard); err == nil && ok && id == target {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("shard %d not led by %s 10s after the transfer", shard, last.cfg.Name)
		}
		_ = n.peer.NodeHost().RequestLeaderTransfer(shard, target)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("shard %d transferred to %s", shard, last.cfg.Name)
	time.Sleep(3 * time.Second)
	if err := last.node.Close(); err != nil {
		t.Fatal(err)
	}
	last.start(t)
	last.waitReady(t)
	t.Logf("%s restarted", last.cfg.Name)
	time.Sleep(3 * time.Second)

	var fromRaft, warnings int
	var unexpected []string
	for _, r := range rec.all() {
		pkg := recordPkg(r)
		if pkg != "" {
			fromRaft++
		}
		if r.Level < slog.LevelWarn {
			continue
		}
		warnings++
		if pkg != "" || !containsAny(r.Message, expectedWarnings) {
			unexpected = append(unexpected, fmt.Sprintf("%v [%s] %s", r.Level, pkg, r.Message))
		}
	}
	t.Logf("%d warnings and errors, %d lines from dragonboat in all", warnings, fromRaft)
	if fromRaft == 0 {
		t.Fatal("no line from dragonboat recorded: the capture does not work, so the count proves nothing")
	}
	if len(unexpected) > 0 {
		t.Errorf("a healthy cluster logged %d unexpected warnings or errors:\n%s", len(unexpected), strings.Join(unexpected, "\n"))
	}
}

func (r logRecorder) all() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]slog.Record(nil), *r.records...)
}

// recordPkg is the dragonboat logger a record came from, "" if it is not
// dragonboat's.
func recordPkg(rec slog.Record) string {
	pkg := ""
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "pkg" {
			pkg = a.Value.String()
		}
		return true
	})
	return pkg
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// Error text: an error a user sees says each thing once.

// repeatedPhrase returns the longest run of two or more words that occurs
// twice in s ("node closed" in "lockmesh: node closed: node closed"), or
// "" if there is none. Words are compared without case or punctuation.
func repeatedPhrase(s string) string {
	words := strings.FieldsFunc(strings.ToLower(s), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	for n := len(words) / 2; n >= 2; n-- {
		seen := map[string]bool{}
		for i := 0; i+n <= len(words); i++ {
			phrase := strings.Join(words[i:i+n], " ")
			if seen[phrase] {
				return phrase
			}
			seen[phrase] = true
		}
	}
	return ""
}

func TestRepeatedPhrase(t *testing.T) {
	for s, want := range map[string]string{
		"lockmesh: node closed: node closed":                      "node closed",
		"lockmesh: lease expired: the lease expired":              "lease expired",
		`lock "a/b": lockmesh: key is locked`:                     "",
		"lockmesh: shard unavailable: shard 4: deadline exceeded": "",
	} {
		if got := repeatedPhrase(s); got != want {
			t.Errorf("repeatedPhrase(%q) = %q, want %q", s, got, want)
		}
	}
}

// sentinels are the package's sentinel errors by name.
var sentinels = map[string]error{
	"ErrLocked": ErrLocked, "ErrLeaseExpired": ErrLeaseExpired, "ErrNotHeld": ErrNotHeld,
	"ErrClosed": ErrClosed, "ErrInvalidKey": ErrInvalidKey, "ErrInvalidConfig": ErrInvalidConfig,
	"ErrUnavailable": ErrUnavailable, "ErrStaleToken": ErrStaleToken,
}

// Every fmt.Errorf in the package that wraps a sentinel reads without a
// repeated phrase once the sentinel's own text is in it. Other operands
// are rendered as distinct placeholders.
func TestSentinelWrapsSayItOnce(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	wraps := 0
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			ast.Inspect(f, func(nd ast.Node) bool {
				call, ok := nd.(*ast.CallExpr)
				if !ok || len(call.Args) < 2 {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Errorf" {
					return true
				}
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				format, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				var operands []string
				wrapsSentinel := false
				for i, arg := range call.Args[1:] {
					if id, ok := arg.(*ast.Ident); ok && sentinels[id.Name] != nil {
						operands = append(operands, sentinels[id.Name].Error())
						wrapsSentinel = true
						continue
					}
					operands = append(operands, fmt.Sprintf("operand%c", 'a'+i))
				}
				if !wrapsSentinel {
					return true
				}
				wraps++
				text := renderFormat(format, operands)
				if p := repeatedPhrase(text); p != "" {
					t.Errorf("%s: %q says %q twice", fset.Position(call.Pos()), text, p)
				}
				return true
			})
		}
	}
	if wraps < 10 {
		t.Fatalf("found only %d wraps of a sentinel: the scan is broken", wraps)
	}
}

// renderFormat puts operands in place of format's verbs, in order.
func renderFormat(format string, operands []string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			b.WriteByte(format[i])
			continue
		}
		i++
		for i < len(format) && strings.IndexByte("+-# 0123456789.", format[i]) >= 0 {
			i++
		}
		if i < len(format) && format[i] == '%' {
			b.WriteByte('%')
			continue
		}
		if len(operands) > 0 {
			b.WriteString(operands[0])
			operands = operands[1:]
		}
	}
	return b.String()
}

// The errors a user sees when the node closes under a held lock and a
// waiter wrap ErrClosed and say each thing once.
func TestCloseErrorsSayItOnce(t *testing.T) {
	peers := startClusterWith(t, clusterOpts{peers: 1, rf: 1, shards: 2}, func(int, *Config) {})
	n := peers[0].node
	ctx := ctxT(t, 20*time.Second)
	l, err := n.Lock(ctx, "close/text")
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() {
		_, err := n.Lock(ctx, "close/text")
		waiter <- err
	}()
	waitQueued(t, n, "close/text", 1)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done still open 30s after Close")
	}
	var waitErr error
	select {
	case waitErr = <-waiter:
	case <-time.After(30 * time.Second):
		t.Fatal("a waiting Lock still blocked 30s after Close")
	}
	_, lockErr := n.Lock(ctx, "close/text")
	for what, err := range map[string]error{
		"Lock.Err":           l.Err(),
		"Unlock":             l.Unlock(ctx),
		"Release":            l.Release(),
		"the waiting Lock":   waitErr,
		"a Lock after Close": lockErr,
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", what, err)
			continue
		}
		t.Logf("%s: %v", what, err)
		if p := repeatedPhrase(err.Error()); p != "" {
			t.Errorf("%s after Close: %q says %q twice", what, err, p)
		}
	}
}
