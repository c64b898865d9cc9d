package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// fakeStatus is a statusSource answering from fixed values, so the page
// is tested without a cluster.
type fakeStatus struct {
	status Status
	top    Top
	keys   map[string]KeyInfo
	// err, when set, is every call's answer.
	err error
	// stuck, when set, makes every call wait for it to close; with
	// ignoreCtx the call does not return when its context ends either,
	// like a buggy source.
	stuck     chan struct{}
	ignoreCtx bool

	mu        sync.Mutex
	topK      []int
	inspected []string
}

func (f *fakeStatus) wait(ctx context.Context) error {
	if f.stuck == nil {
		return f.err
	}
	if f.ignoreCtx {
		<-f.stuck
		return f.err
	}
	select {
	case <-f.stuck:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeStatus) Status(ctx context.Context) (Status, error) {
	if err := f.wait(ctx); err != nil {
		return Status{}, err
	}
	return f.status, nil
}

func (f *fakeStatus) Top(ctx context.Context, k int) (Top, error) {
	f.mu.Lock()
	f.topK = append(f.topK, k)
	f.mu.Unlock()
	if err := f.wait(ctx); err != nil {
		return Top{}, err
	}
	return f.top, nil
}

func (f *fakeStatus) Inspect(ctx context.Context, key string) (KeyInfo, error) {
	f.mu.Lock()
	f.inspected = append(f.inspected, key)
	f.mu.Unlock()
	if err := lockfsm.ValidateKey(key); err != nil {
		return KeyInfo{}, fmt.Errorf("%w: %v", ErrInvalidKey, err)
	}
	if err := f.wait(ctx); err != nil {
		return KeyInfo{}, err
	}
	info, ok := f.keys[key]
	if !ok {
		info = KeyInfo{Key: key, Shard: 2}
	}
	return info, nil
}

const hostileKey = `<script>alert(1)</script>`

// newFakeStatus is a 3-peer cluster as a peer would report it: shard 3
// without a leader, one replica not reporting, peer-3 not alive; orders/17
// held by peer-1 and waited for by peer-2 then peer-3; and a hostile key
// in every place a key is shown.
func newFakeStatus() *fakeStatus {
	since := time.Date(2026, 11, 25, 6, 0, 0, 0, time.UTC)
	return &fakeStatus{
		status: Status{
			Peer: "peer-1", Release: "v1.4.0", Cluster: 0xfeedfacecafebeef, Level: 4, Ready: true,
			Members: []MemberStatus{
				{Member: Member{Name: "peer-1", GossipAddr: "127.0.0.1:7001", RaftAddr: "127.0.0.1:7002", RPCAddr: "127.0.0.1:7003", Alive: true, Cluster: 0xfeedfacecafebeef}, Level: 4},
				{Member: Member{Name: "peer-2", GossipAddr: "127.0.0.1:7101", Alive: true, Cluster: 0xfeedfacecafebeef}, Level: 4, NoReplicas: true},
				{Member: Member{Name: "peer-3", Cluster: 0xfeedfacecafebeef}},
			},
			Shards: []ShardStatus{
				{Shard: 1, Leader: "peer-1", Counted: true, Sessions: 3, Keys: 7, Holders: 5, Waiters: 2, Replicas: []ReplicaStatus{
					{Peer: "peer-1", Replica: 11, Leader: true, Reported: true, Applied: 1200},
					{Peer: "peer-3", Replica: 13, Reported: false},
				}},
				{Shard: 3, Leader: "", Replicas: []ReplicaStatus{{Peer: "peer-3", Replica: 31}}},
			},
		},
		top: Top{
			Contended: []ContendedKey{
				{Key: "orders/17", Shard: 2, Waiters: 2, OldestWait: 1234 * time.Millisecond, Handoffs: 9, TotalWait: 184 * time.Second, Overcount: 2 * time.Second, Since: since},
				{Key: hostileKey, Shard: 1, Handoffs: 1, TotalWait: 3 * time.Millisecond, Since: since},
			},
			LongestHolds: []LongHold{
				{Key: "orders/17", Shard: 2, Peer: "peer-1", Session: 0xfedcba9876543210, Token: 42, HeldFor: 3*time.Minute + 4*time.Second, AtLeast: true},
				{Key: hostileKey, Shard: 1, Peer: "peer-2", Session: 7, Token: 5, HeldFor: 1500 * time.Millisecond},
			},
			Missing: []uint64{4, 5},
		},
		keys: map[string]KeyInfo{
			"orders/17": {Key: "orders/17", Shard: 2,
				Holders: []Holder{{Peer: "peer-1", Session: 0xfedcba9876543210, ShardSession: 3, Request: 8, Token: 42, Age: 2 * time.Second}},
				Waiters: []Holder{
					{Peer: "peer-2", Session: 22, ShardSession: 4, Request: 1, Age: 1234 * time.Millisecond},
					{Peer: "peer-3", Session: 33, ShardSession: 5, Request: 1, Age: 10 * time.Minute, AtLeast: true},
				}},
			hostileKey: {Key: hostileKey, Shard: 1,
				Holders: []Holder{{Peer: "peer-2", Session: 7, Token: 5}}},
		},
	}
}

// get serves one request through h, addressed to a loopback host as an
// operator's browser on the same machine sends it, and returns the
// response with its body.
func get(t *testing.T, h http.Handler, method, target string) (*http.Response, string) {
	t.Helper()
	return getHost(t, h, method, "127.0.0.1:8080", target)
}

// getHost is get with the request's Host header set to host.
func getHost(t *testing.T, h http.Handler, method, host, target string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, target, nil)
	req.Host = host
	h.ServeHTTP(rec, req)
	resp := rec.Result()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func decodeJSON(t *testing.T, body string) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("body is not a JSON object: %v\n%s", err, body)
	}
	return v
}

// wantKeys fails unless the JSON object has exactly these fields: they
// are what scripts reading the page rely on.
func wantKeys(t *testing.T, what string, v any, keys ...string) {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s is %T, want a JSON object", what, v)
	}
	want := map[string]bool{}
	for _, k := range keys {
		want[k] = true
		if _, ok := m[k]; !ok {
			t.Errorf("%s lacks field %q: %v", what, k, m)
		}
	}
	for k := range m {
		if !want[k] {
			t.Errorf("%s has unexpected field %q", what, k)
		}
	}
}

func TestHandlerIndex(t *testing.T) {
	h := newStatusHandler(newFakeStatus())
	resp, body := get(t, h, "GET", "/")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET / = %d, want 200:\n%s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	for _, want := range []string{
		`<dd id="peer">peer-1</dd>`, `<dd id="release">v1.4.0</dd>`, `<dd id="cluster">feedfacecafebeef</dd>`,
		`<dd id="level">4</dd>`, `<dd id="ready">yes</dd>`,
		// members: state, level, addresses, client-only
		`<td>peer-3</td>`, `<span class="warn">not alive</span>`, `gossip 127.0.0.1:7001`, `rpc 127.0.0.1:7003`, `<td>yes</td>`,
		// shards: leaderless warning, replica progress, counts
		`<span class="warn">no leader</span>`, `peer-1 ★: applied 1200, lag 0`, `not reported`,
		`<td>3</td><td>7</td><td>5</td><td>2</td>`, `not counted`,
		// top
		`shards that did not answer: 4, 5`, `<a href="?k=orders%2f17">orders/17</a>`, `<td>1.2s</td>`, `3m4s`,
		`(may be over by ≤2s)`, `≥3m4s`, `18364758544493064720`, `<td>42</td>`,
		// the lookup form posts to the page itself, relatively
		`action="./"`, `<script src="app.js" defer></script>`, `href="app.css"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, `id="key-result" hidden`) == false {
		t.Errorf("page without ?k= shows a key result")
	}
	for name, want := range map[string]string{
		"Cache-Control":           "no-store",
		"X-Content-Type-Options":  "nosniff",
		"Content-Security-Policy": statusCSP,
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") || strings.Contains(body, "<script>") || strings.Contains(body, "<style") {
		t.Errorf("page relies on inline code, which its policy forbids")
	}
}

func TestHandlerIndexKeyLookup(t *testing.T) {
	f := newFakeStatus()
	h := newStatusHandler(f)
	resp, body := get(t, h, "GET", "/?k="+url.QueryEscape("orders/17"))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /?k=orders/17 = %d:\n%s", resp.StatusCode, body)
	}
	for _, want := range []string{
		`<code id="key-name">orders/17</code>`, `value="orders/17"`,
		`<tr><td>peer-1</td><td>18364758544493064720</td><td>42</td><td>2s</td></tr>`,
		`<tr><td>1</td><td>peer-2</td><td>22</td><td>1.2s</td></tr>`,
		`<tr><td>2</td><td>peer-3</td><td>33</td><td>≥10m</td></tr>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(body, `id="key-result" hidden`) {
		t.Errorf("key result hidden")
	}

	// A key nobody holds says so; a blank form asks nothing.
	_, body = get(t, h, "GET", "/?k=free")
	for _, want := range []string{"nobody holds the key", "nobody waits"} {
		if !strings.Contains(body, want) {
			t.Errorf("lookup of a free key lacks %q", want)
		}
	}
	f.inspected = nil
	if resp, _ := get(t, h, "GET", "/?k="); resp.StatusCode != http.StatusOK || len(f.inspected) != 0 {
		t.Errorf("blank lookup: %d, inspected %q; want 200 and no question", resp.StatusCode, f.inspected)
	}
	// A key no lock can have is the caller's mistake, shown on the page.
	resp, body = get(t, h, "GET", "/?k="+strings.Repeat("x", lockfsm.MaxKeyLen+1))
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "invalid key") {
		t.Errorf("oversized key: %d, want 400 with the error on the page", resp.StatusCode)
	}
}

func TestHandlerEscapesHostileKey(t *testing.T) {
	h := newStatusHandler(newFakeStatus())
	_, body := get(t, h, "GET", "/?k="+url.QueryEscape(hostileKey))
	if strings.Contains(body, hostileKey) || strings.Contains(body, "<script>alert") {
		t.Fatalf("page contains the key unescaped:\n%s", body)
	}
	escaped := "&lt;script&gt;alert(1)&lt;/script&gt;"
	// The key in the contended table, the holds table, the lookup's
	// title and the form's value.
	if n := strings.Count(body, escaped); n != 4 {
		t.Errorf("escaped key appears %d times, want it in both tables' text, the lookup and the form", n)
	}
	if !strings.Contains(body, `href="?k=%3cscript%3ealert%281%29%3c%2fscript%3e"`) {
		t.Errorf("key link is not query-escaped:\n%s", body)
	}

	for _, target := range []string{"/key?k=" + url.QueryEscape(hostileKey), "/top.json"} {
		resp, body := get(t, h, "GET", target)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s = %d", target, resp.StatusCode)
		}
		if strings.Contains(body, "<script>") {
			t.Errorf("%s has a raw <script> a browser sniffing it could run:\n%s", target, body)
		}
		if !strings.Contains(body, `\u003cscript\u003ealert(1)\u003c/script\u003e`) {
			t.Errorf("%s lacks the key escaped for JSON:\n%s", target, body)
		}
	}

	// The script writes data only as text.
	js, err := statusFiles.ReadFile("statuspage/app.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
		if strings.Contains(string(js), sink) {
			t.Errorf("app.js uses %s", sink)
		}
	}
}

func TestHandlerStatusJSON(t *testing.T) {
	h := newStatusHandler(newFakeStatus())
	resp, body := get(t, h, "GET", "/status.json")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /status.json = %d:\n%s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	v := decodeJSON(t, body)
	wantKeys(t, "status", v, "peer", "release", "cluster", "level", "ready", "members", "shards")
	if v["cluster"] != "feedfacecafebeef" || v["peer"] != "peer-1" || v["level"] != 4.0 || v["ready"] != true {
		t.Errorf("status = %v", v)
	}
	members := v["members"].([]any)
	if len(members) != 3 {
		t.Fatalf("%d members, want 3", len(members))
	}
	wantKeys(t, "member", members[0], "name", "alive", "level", "gossip_addr", "raft_addr", "rpc_addr", "cluster", "client_only")
	if m := members[1].(map[string]any); m["client_only"] != true || m["name"] != "peer-2" {
		t.Errorf("member 2 = %v", m)
	}
	if m := members[2].(map[string]any); m["alive"] != false || m["level"] != 0.0 {
		t.Errorf("member 3 = %v", m)
	}
	shards := v["shards"].([]any)
	wantKeys(t, "shard", shards[0], "shard", "leader", "replicas", "counted", "sessions", "keys", "holders", "waiters")
	replicas := shards[0].(map[string]any)["replicas"].([]any)
	wantKeys(t, "replica", replicas[0], "peer", "replica", "leader", "reported", "applied", "lag")
	if r := replicas[0].(map[string]any); r["applied"] != 1200.0 || r["leader"] != true {
		t.Errorf("replica = %v", r)
	}
	if s := shards[1].(map[string]any); s["leader"] != "" || s["counted"] != false {
		t.Errorf("leaderless shard = %v", s)
	}

	// An empty status has lists, not nulls, so scripts can iterate.
	_, body = get(t, newStatusHandler(&fakeStatus{}), "GET", "/status.json")
	if v := decodeJSON(t, body); v["cluster"] != "" || v["members"] == nil || v["shards"] == nil {
		t.Errorf("empty status = %s", body)
	}
}

func TestHandlerTopJSON(t *testing.T) {
	f := newFakeStatus()
	h := newStatusHandler(f)
	resp, body := get(t, h, "GET", "/top.json")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /top.json = %d:\n%s", resp.StatusCode, body)
	}
	v := decodeJSON(t, body)
	wantKeys(t, "top", v, "contended", "longest_holds", "missing")
	c := v["contended"].([]any)[0]
	wantKeys(t, "contended key", c, "key", "shard", "waiters", "oldest_wait_ms", "oldest_wait", "handoffs",
		"total_wait_ms", "total_wait", "overcount_ms", "overcount", "since")
	cm := c.(map[string]any)
	if cm["key"] != "orders/17" || cm["oldest_wait_ms"] != 1234.0 || cm["oldest_wait"] != "1.2s" ||
		cm["total_wait"] != "3m4s" || cm["since"] != "2026-11-25T06:00:00Z" || cm["handoffs"] != 9.0 {
		t.Errorf("contended key = %v", cm)
	}
	l := v["longest_holds"].([]any)[0]
	wantKeys(t, "long hold", l, "key", "shard", "peer", "session", "token", "held_for_ms", "held_for", "at_least")
	lm := l.(map[string]any)
	if lm["session"] != "18364758544493064720" || lm["held_for"] != "≥3m4s" || lm["held_for_ms"] != 184000.0 || lm["at_least"] != true {
		t.Errorf("long hold = %v", lm)
	}
	if fmt.Sprint(v["missing"]) != "[4 5]" {
		t.Errorf("missing = %v", v["missing"])
	}

	if _, _ = get(t, h, "GET", "/top.json?k=3"); fmt.Sprint(f.topK) != "[10 3]" {
		t.Errorf("Top asked for %v, want the default 10 then 3", f.topK)
	}
	for _, k := range []string{"0", "101", "-1", "ten", "", "1e3"} {
		resp, body := get(t, h, "GET", "/top.json?k="+url.QueryEscape(k))
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("k=%q: %d, want 400", k, resp.StatusCode)
			continue
		}
		if msg := decodeJSON(t, body)["error"]; !strings.Contains(fmt.Sprint(msg), fmt.Sprintf("k=%q", k)) ||
			!strings.Contains(fmt.Sprint(msg), "1 to 100") {
			t.Errorf("k=%q: error %q does not name the value and the range", k, msg)
		}
	}
	if fmt.Sprint(f.topK) != "[10 3]" {
		t.Errorf("a bad k reached the cluster: Top asked for %v", f.topK)
	}
}

func TestHandlerKeyJSON(t *testing.T) {
	f := newFakeStatus()
	h := newStatusHandler(f)
	resp, body := get(t, h, "GET", "/key?k=orders/17")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /key = %d:\n%s", resp.StatusCode, body)
	}
	v := decodeJSON(t, body)
	wantKeys(t, "key", v, "key", "shard", "holders", "waiters")
	holders, waiters := v["holders"].([]any), v["waiters"].([]any)
	if len(holders) != 1 || len(waiters) != 2 {
		t.Fatalf("%d holders and %d waiters, want 1 and 2", len(holders), len(waiters))
	}
	wantKeys(t, "holder", holders[0], "peer", "session", "shard_session", "request", "token", "age_ms", "age", "at_least")
	if h := holders[0].(map[string]any); h["peer"] != "peer-1" || h["token"] != 42.0 || h["age_ms"] != 2000.0 || h["session"] != "18364758544493064720" {
		t.Errorf("holder = %v", h)
	}
	if w0, w1 := waiters[0].(map[string]any), waiters[1].(map[string]any); w0["peer"] != "peer-2" || w1["peer"] != "peer-3" || w1["age"] != "≥10m" {
		t.Errorf("waiters out of FIFO order or ages wrong: %v", waiters)
	}
	_, body = get(t, h, "GET", "/key?k=free")
	if v := decodeJSON(t, body); fmt.Sprint(v["holders"], v["waiters"]) != "[] []" {
		t.Errorf("free key = %s, want empty lists", body)
	}

	asked := len(f.inspected)
	for target, want := range map[string]string{
		"/key":    "missing k",
		"/key?k=": "invalid key",
		"/key?k=" + strings.Repeat("x", lockfsm.MaxKeyLen+1): "longer than the limit",
	} {
		resp, body := get(t, h, "GET", target)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%.20s: %d, want 400", target, resp.StatusCode)
			continue
		}
		if msg := fmt.Sprint(decodeJSON(t, body)["error"]); !strings.Contains(msg, want) {
			t.Errorf("%.20s: error %q lacks %q", target, msg, want)
		}
	}
	if len(f.inspected) != asked {
		t.Errorf("an invalid key reached the cluster: %q", f.inspected[asked:])
	}
}

func TestHandlerMethods(t *testing.T) {
	h := newStatusHandler(newFakeStatus())
	for _, target := range []string{"/", "/status.json", "/top.json", "/key?k=a", "/app.js", "/nope"} {
		for _, method := range []string{"POST", "PUT", "DELETE", "PATCH"} {
			resp, body := get(t, h, method, target)
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: %d Allow %q, want 405 with Allow: GET, HEAD", method, target, resp.StatusCode, resp.Header.Get("Allow"))
			}
			if !strings.Contains(body, "read-only") {
				t.Errorf("%s %s: body %q does not say why", method, target, body)
			}
		}
		if resp, _ := get(t, h, "HEAD", target); target != "/nope" && resp.StatusCode != http.StatusOK {
			t.Errorf("HEAD %s: %d, want 200", target, resp.StatusCode)
		}
	}
	if resp, _ := get(t, h, "POST", "/status.json"); resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Errorf("405 of a JSON endpoint is not JSON")
	}
}

func TestHandlerAssets(t *testing.T) {
	h := newStatusHandler(newFakeStatus())
	for target, ctype := range map[string]string{"/app.js": "text/javascript; charset=utf-8", "/app.css": "text/css; charset=utf-8"} {
		resp, body := get(t, h, "GET", target)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ctype || len(body) < 100 {
			t.Errorf("GET %s: %d %q, %d bytes", target, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
	}
	for _, target := range []string{"/index.html", "/statuspage/app.js", "/status", "/app.js/x"} {
		if resp, _ := get(t, h, "GET", target); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", target, resp.StatusCode)
		}
	}
}

func TestHandlerSourceError(t *testing.T) {
	f := newFakeStatus()
	f.err = fmt.Errorf("shard 3: %w", ErrUnavailable)
	h := newStatusHandler(f)
	for _, target := range []string{"/status.json", "/top.json", "/key?k=orders/17"} {
		resp, body := get(t, h, "GET", target)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("%s: %d, want 503", target, resp.StatusCode)
			continue
		}
		v := decodeJSON(t, body)
		wantKeys(t, target+" error", v, "error")
		if msg := fmt.Sprint(v["error"]); !strings.Contains(msg, f.err.Error()) {
			t.Errorf("%s: error %q does not carry the cause %q", target, msg, f.err)
		}
	}
	resp, body := get(t, h, "GET", "/?k=orders/17")
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("page: %d, want 503", resp.StatusCode)
	}
	for _, id := range []string{"status-error", "top-error", "key-error"} {
		want := fmt.Sprintf(`<p id="%s" class="error">`, id)
		if !strings.Contains(body, want) || !strings.Contains(body, f.err.Error()) {
			t.Errorf("page does not show the error in #%s", id)
		}
	}
}

func TestHandlerStuckSource(t *testing.T) {
	for _, ignoreCtx := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignoreCtx=%v", ignoreCtx), func(t *testing.T) {
			f := newFakeStatus()
			f.stuck, f.ignoreCtx = make(chan struct{}), ignoreCtx
			// Let the abandoned calls finish, for the leak check.
			t.Cleanup(func() { close(f.stuck) })
			h := newStatusHandler(f)
			h.timeout = 50 * time.Millisecond
			for _, target := range []string{"/status.json", "/top.json", "/key?k=a", "/"} {
				start := time.Now()
				resp, body := get(t, h, "GET", target)
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("%s took %v with a 50ms timeout", target, took)
				}
				if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "no answer within 50ms") {
					t.Errorf("%s: %d %q, want 503 saying no answer within 50ms", target, resp.StatusCode, body)
				}
			}
		})
	}
}

// TestHandlerUnderPrefix mounts the page below a path, as an application
// does, and follows every link, script, form and fetch the page and its
// script use: all relative, they must land on the handler's routes.
func TestHandlerUnderPrefix(t *testing.T) {
	h := newStatusHandler(newFakeStatus())
	mux := http.NewServeMux()
	mux.Handle("/debug/lockmesh/", http.StripPrefix("/debug/lockmesh", h))
	// A router that also hands the bare mount point over.
	mux.Handle("/debug/lockmesh", http.StripPrefix("/debug/lockmesh", h))
	// StripPrefix with the slash kept in the prefix.
	mux.Handle("/other/", http.StripPrefix("/other/", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for _, mount := range []string{"/debug/lockmesh/", "/other/"} {
		page := srv.URL + mount + "?k=orders/17"
		resp, err := http.Get(page)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "peer-2") {
			t.Fatalf("GET %s: %d", page, resp.StatusCode)
		}
		base, _ := url.Parse(page)
		refs := []string{"status.json", "top.json?k=10", "key?k=orders%2F17"} // app.js's fetches
		for _, m := range regexp.MustCompile(`(?:href|src|action)="([^"]*)"`).FindAllStringSubmatch(string(body), -1) {
			refs = append(refs, m[1])
		}
		for _, ref := range refs {
			u, err := base.Parse(strings.ReplaceAll(ref, "&amp;", "&"))
			if err != nil {
				t.Fatalf("%s: %v", ref, err)
			}
			if !strings.HasPrefix(u.Path, mount) {
				t.Errorf("%q on the page at %s leads out of the mount point to %s", ref, mount, u.Path)
				continue
			}
			resp, err := http.Get(u.String())
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%q on the page at %s: GET %s = %d", ref, mount, u, resp.StatusCode)
			}
		}
	}

	// The bare mount point redirects to the slashed one, where the
	// relative links resolve, and keeps the query.
	resp, err := http.Get(srv.URL + "/debug/lockmesh?k=orders/17")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/debug/lockmesh/" || resp.Request.URL.Query().Get("k") != "orders/17" {
		t.Errorf("GET /debug/lockmesh ended at %s with %d, want /debug/lockmesh/?k=orders/17", resp.Request.URL, resp.StatusCode)
	}
}

func TestHandlerHumanDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{850 * time.Microsecond, "850µs"},
		{1234 * time.Microsecond, "1.2ms"},
		{12345 * time.Microsecond, "12ms"},
		{999700 * time.Microsecond, "1s"},
		{1234 * time.Millisecond, "1.2s"},
		{59960 * time.Millisecond, "1m"},
		{3*time.Minute + 4*time.Second + 300*time.Millisecond, "3m4s"},
		{2*time.Hour + 5*time.Minute + 10*time.Second, "2h5m"},
		{2*time.Hour + 10*time.Second, "2h"},
		{76*time.Hour + 20*time.Minute, "3d4h"},
		{72 * time.Hour, "3d"},
	} {
		if got := humanDuration(tc.d); got != tc.want {
			t.Errorf("humanDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	if got := ageText(0, false); got != "unknown" {
		t.Errorf("ageText(0) = %q, want unknown", got)
	}
	if got := ageText(0, true); got != "≥0s" {
		t.Errorf("ageText(0, at least) = %q", got)
	}
}

// The handler checks the key itself, and the error it returns is the
// one Node.Inspect returns, so callers can test for it.
func TestHandlerInvalidKeyIsErrInvalidKey(t *testing.T) {
	_, err := newStatusHandler(&fakeStatus{}).inspect(context.Background(), "")
	if !errors.Is(err, ErrInvalidKey) {
		t.Errorf("inspect of an empty key: %v, want ErrInvalidKey", err)
	}
}

// DNS rebinding: a web page the operator visits points a name of its own
// at 127.0.0.1 and reads the status page as its own origin; the browser
// still sends that name as Host. The page answers only to loopback
// addresses and localhost unless the application allows more names.
func TestHandlerRefusesOtherHosts(t *testing.T) {
	f := newFakeStatus()
	h := newStatusHandler(f)
	for _, target := range []string{"/", "/status.json", "/top.json", "/key?k=orders/17", "/app.js"} {
		for _, host := range []string{"evil.example", "evil.example:8080", "lockmesh.ops.example", ""} {
			resp, body := getHost(t, h, "GET", host, target)
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("GET %s with Host %q: %d, want 421", target, host, resp.StatusCode)
				continue
			}
			if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || !strings.Contains(body, fmt.Sprintf("Host %q refused", host)) ||
				!strings.Contains(body, "WithAllowedHosts") {
				t.Errorf("GET %s with Host %q: refusal %q (%s) is not plain text naming the host and the option", target, host, body, resp.Header.Get("Content-Type"))
			}
			if strings.Contains(body, "peer-1") || strings.Contains(body, "orders/17") {
				t.Errorf("GET %s with Host %q: the refusal shows the page: %q", target, host, body)
			}
		}
		for _, host := range []string{"127.0.0.1:8080", "127.0.0.1", "localhost", "localhost:8080", "[::1]:8080"} {
			if resp, _ := getHost(t, h, "GET", host, target); resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s with Host %q: %d, want 200", target, host, resp.StatusCode)
			}
		}
	}
	f.mu.Lock()
	inspected := len(f.inspected)
	f.mu.Unlock()
	if want := 5; inspected != want { // /key?k= for the allowed hosts only
		t.Errorf("the source was asked %d key lookups, want %d: refused requests must not reach the cluster", inspected, want)
	}

	// An application serving the page under its own name allows it; the
	// rest stay refused.
	named := newStatusHandler(f, WithAllowedHosts("lockmesh.ops.example", "10.0.0.5"))
	for host, want := range map[string]int{
		"lockmesh.ops.example": http.StatusOK, "LockMesh.Ops.Example:443": http.StatusOK, "10.0.0.5:8080": http.StatusOK,
		"127.0.0.1:8080": http.StatusOK, "localhost": http.StatusOK,
		"evil.example": http.StatusMisdirectedRequest, "ops.example": http.StatusMisdirectedRequest, "10.0.0.6": http.StatusMisdirectedRequest,
	} {
		if resp, _ := getHost(t, named, "GET", host, "/status.json"); resp.StatusCode != want {
			t.Errorf("WithAllowedHosts: GET /status.json with Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}

	// Over a real connection, the Host the client sends decides.
	srv := httptest.NewServer(h)
	defer srv.Close()
	for host, want := range map[string]int{"": http.StatusOK, "evil.example": http.StatusMisdirectedRequest} {
		req, _ := http.NewRequest("GET", srv.URL+"/status.json", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s with Host %q: %d, want %d", srv.URL, host, resp.StatusCode, want)
		}
	}
}
