// The status page over a fake statusSource of node's types: how Status,
// Top and KeyInfo read on the page and in its JSON, that the adapter
// passes errors through, and WithAllowedHosts. The page's HTTP mechanics
// (methods, assets, headers, timeouts, mounting) are tested in
// internal/statuspage.

package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
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
				Holders: []Holder{{Peer: "peer-1", Session: 0xfedcba9876543210, ShardSession: 3, Request: 8, Token: 42, Age: 2 * time.Second, Kind: "read", Permits: 1}},
				Waiters: []Holder{
					{Peer: "peer-2", Session: 22, ShardSession: 4, Request: 1, Age: 1234 * time.Millisecond, Kind: "write", Permits: 1},
					{Peer: "peer-3", Session: 33, ShardSession: 5, Request: 1, Age: 10 * time.Minute, AtLeast: true, Kind: "semaphore", Permits: 2},
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
	// statuspage.TestHeaders pins the whole Content-Security-Policy.
	for name, want := range map[string]string{
		"Cache-Control":          "no-store",
		"X-Content-Type-Options": "nosniff",
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
		`<tr><td>peer-1</td><td>18364758544493064720</td><td>42</td><td>2s</td><td>read</td></tr>`,
		`<tr><td>1</td><td>peer-2</td><td>22</td><td>1.2s</td><td>write</td></tr>`,
		`<tr><td>2</td><td>peer-3</td><td>33</td><td>≥10m</td><td>2 of a semaphore</td></tr>`,
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
	resp, js := get(t, h, "GET", "/app.js")
	if resp.StatusCode != http.StatusOK || len(js) < 100 {
		t.Fatalf("GET /app.js: %d, %d bytes", resp.StatusCode, len(js))
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
		if strings.Contains(js, sink) {
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
	wantKeys(t, "status", v, "peer", "release", "cluster", "level", "ready", "peers_down", "shards_without_leader", "members", "shards")
	if v["cluster"] != "feedfacecafebeef" || v["peer"] != "peer-1" || v["level"] != 4.0 || v["ready"] != true {
		t.Errorf("status = %v", v)
	}
	// peer-3 is not alive, and shard 3 has no leader known.
	if v["peers_down"] != 1.0 || v["shards_without_leader"] != 1.0 {
		t.Errorf("summary: %v peers down, %v shards without a leader; want 1 and 1", v["peers_down"], v["shards_without_leader"])
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
	wantKeys(t, "holder", holders[0], "peer", "session", "shard_session", "request", "token", "age_ms", "age", "at_least", "kind")
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

// The page checks the key itself, before it asks the cluster, and its
// error is the one Node.Inspect returns (ErrInvalidKey), so what the
// operator reads is what callers test for.
func TestHandlerInvalidKeyIsErrInvalidKey(t *testing.T) {
	f := &fakeStatus{}
	resp, body := get(t, newStatusHandler(f), "GET", "/key?k=")
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("GET /key?k=: %d, want 400", resp.StatusCode)
	}
	if msg := fmt.Sprint(decodeJSON(t, body)["error"]); !strings.HasPrefix(msg, ErrInvalidKey.Error()+": ") {
		t.Errorf("GET /key?k=: error %q, want ErrInvalidKey's %q", msg, ErrInvalidKey)
	}
	if len(f.inspected) != 0 {
		t.Errorf("an empty key reached the cluster: %q", f.inspected)
	}
}

// WithAllowedHosts reaches the page: an application serving the page
// under its own names allows them, options add up, and the rest stay
// refused (internal/statuspage's TestRefusesOtherHosts covers the
// refusal itself).
func TestHandlerAllowedHosts(t *testing.T) {
	named := newStatusHandler(newFakeStatus(), WithAllowedHosts("lockmesh.ops.example", "10.0.0.5"), WithAllowedHosts("app-7.ops.example"))
	for host, want := range map[string]int{
		"lockmesh.ops.example": http.StatusOK, "LockMesh.Ops.Example:443": http.StatusOK, "10.0.0.5:8080": http.StatusOK,
		"app-7.ops.example": http.StatusOK, "127.0.0.1:8080": http.StatusOK, "localhost": http.StatusOK,
		"evil.example": http.StatusMisdirectedRequest, "ops.example": http.StatusMisdirectedRequest, "10.0.0.6": http.StatusMisdirectedRequest,
	} {
		if resp, _ := getHost(t, named, "GET", host, "/status.json"); resp.StatusCode != want {
			t.Errorf("WithAllowedHosts: GET /status.json with Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
}
