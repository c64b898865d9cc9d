// The page's HTTP mechanics tested over a fake Source of views: methods,
// assets, headers, the Host check, mounting under a prefix, timeouts, key
// validation and the text helpers. How node's types read on the page is
// tested in node (handler_test.go).

package statuspage

import (
	"context"
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

	"go.uber.org/goleak"

	"github.com/lockmesh/lockmesh/internal/lockerr"
	"github.com/lockmesh/lockmesh/lockfsm"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// stuck Source's call is abandoned, but must end once the Source does.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeSource is a Source answering from fixed views.
type fakeSource struct {
	status Status
	top    Top
	keys   map[string]Key
	// err, when set, is every call's answer.
	err error
	// stuck, when set, makes every call wait for it to close; with
	// ignoreCtx the call does not return when its context ends either,
	// like a buggy source.
	stuck     chan struct{}
	ignoreCtx bool

	mu    sync.Mutex
	topK  []int
	asked []string
}

func (f *fakeSource) wait(ctx context.Context) error {
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

func (f *fakeSource) Status(ctx context.Context) (Status, error) {
	if err := f.wait(ctx); err != nil {
		return Status{}, err
	}
	return f.status, nil
}

func (f *fakeSource) Top(ctx context.Context, k int) (Top, error) {
	f.mu.Lock()
	f.topK = append(f.topK, k)
	f.mu.Unlock()
	if err := f.wait(ctx); err != nil {
		return Top{}, err
	}
	return f.top, nil
}

func (f *fakeSource) Key(ctx context.Context, key string) (Key, error) {
	f.mu.Lock()
	f.asked = append(f.asked, key)
	f.mu.Unlock()
	if err := f.wait(ctx); err != nil {
		return Key{}, err
	}
	info, ok := f.keys[key]
	if !ok {
		info = Key{Key: key, Shard: 2, Holders: []Holder{}, Waiters: []Holder{}}
	}
	return info, nil
}

func (f *fakeSource) keysAsked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

// newFakeSource is a peer's answers as views: orders/17 held by peer-1
// and waited for by peer-2 then peer-3, and contended.
func newFakeSource() *fakeSource {
	return &fakeSource{
		status: Status{
			Peer: "peer-1", Release: "v1.4.0", Cluster: "feedfacecafebeef", Level: 4, Ready: true,
			Members: []Member{
				{Name: "peer-1", Alive: true, Level: 4, GossipAddr: "127.0.0.1:7001", Cluster: "feedfacecafebeef"},
				{Name: "peer-2", Alive: true, Level: 4, Cluster: "feedfacecafebeef", ClientOnly: true},
			},
			Shards: []Shard{{Shard: 1, Leader: "peer-1", Counted: true, Keys: 1, Holders: 1, Waiters: 2,
				Replicas: []Replica{{Peer: "peer-1", Replica: 11, Leader: true, Reported: true, Applied: 1200}}}},
		},
		top: Top{
			Contended: []Contended{{Key: "orders/17", Shard: 2, Waiters: 2, OldestWaitMS: 1234, OldestWait: "1.2s",
				Handoffs: 9, TotalWaitMS: 184000, TotalWait: "3m4s", Overcount: "0s", Since: "2026-11-25T06:00:00Z"}},
			LongestHolds: []LongHold{{Key: "orders/17", Shard: 2, Peer: "peer-1", Session: "18364758544493064720", Token: 42,
				HeldForMS: 184000, HeldFor: "≥3m4s", AtLeast: true}},
			Missing: []uint64{},
		},
		keys: map[string]Key{
			"orders/17": {Key: "orders/17", Shard: 2,
				Holders: []Holder{{Peer: "peer-1", Session: "18364758544493064720", Token: 42, AgeMS: 2000, Age: "2s"}},
				Waiters: []Holder{
					{Peer: "peer-2", Session: "22", ShardSession: 4, Request: 1, AgeMS: 1234, Age: "1.2s"},
					{Peer: "peer-3", Session: "33", ShardSession: 5, Request: 1, AgeMS: 600000, Age: "≥10m", AtLeast: true},
				}},
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

// TestHeaders: every answer, page, JSON, asset, 404, 405 or 421, carries
// the headers that keep it out of caches, sniffers and other sites.
func TestHeaders(t *testing.T) {
	h := New(newFakeSource(), nil)
	for _, tc := range []struct{ method, host, target string }{
		{"GET", "127.0.0.1:8080", "/"},
		{"GET", "127.0.0.1:8080", "/?k=orders/17"},
		{"GET", "127.0.0.1:8080", "/status.json"},
		{"GET", "127.0.0.1:8080", "/top.json"},
		{"GET", "127.0.0.1:8080", "/key?k=orders/17"},
		{"GET", "127.0.0.1:8080", "/app.js"},
		{"GET", "127.0.0.1:8080", "/nope"},
		{"POST", "127.0.0.1:8080", "/status.json"},
		{"GET", "evil.example", "/"},
	} {
		resp, _ := getHost(t, h, tc.method, tc.host, tc.target)
		for name, want := range map[string]string{
			"Cache-Control":           "no-store",
			"X-Content-Type-Options":  "nosniff",
			"Content-Security-Policy": csp,
			"Referrer-Policy":         "no-referrer",
		} {
			if got := resp.Header.Get(name); got != want {
				t.Errorf("%s %s (Host %s): %s: %q, want %q", tc.method, tc.target, tc.host, name, got, want)
			}
		}
	}
}

func TestMethods(t *testing.T) {
	h := New(newFakeSource(), nil)
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

func TestAssets(t *testing.T) {
	h := New(newFakeSource(), nil)
	for target, ctype := range map[string]string{"/app.js": "text/javascript; charset=utf-8", "/app.css": "text/css; charset=utf-8"} {
		resp, body := get(t, h, "GET", target)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != ctype || len(body) < 100 {
			t.Errorf("GET %s: %d %q, %d bytes", target, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
	}
	for _, target := range []string{"/index.html", "/assets/app.js", "/statuspage/app.js", "/status", "/app.js/x"} {
		if resp, _ := get(t, h, "GET", target); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", target, resp.StatusCode)
		}
	}
}

func TestStuckSource(t *testing.T) {
	for _, ignoreCtx := range []bool{false, true} {
		t.Run(fmt.Sprintf("ignoreCtx=%v", ignoreCtx), func(t *testing.T) {
			f := newFakeSource()
			f.stuck, f.ignoreCtx = make(chan struct{}), ignoreCtx
			// Let the abandoned calls finish, for the leak check.
			t.Cleanup(func() { close(f.stuck) })
			h := &handler{src: f, timeout: 50 * time.Millisecond}
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

// TestInvalidKey: a key no lock can have is refused before the Source is
// asked, with an error that is lockerr.InvalidKey (node.ErrInvalidKey);
// and a Source's error that wraps it is the caller's mistake too.
func TestInvalidKey(t *testing.T) {
	f := newFakeSource()
	h := &handler{src: f, timeout: timeout}
	if _, err := h.lookup(context.Background(), ""); !errors.Is(err, lockerr.InvalidKey) {
		t.Errorf("lookup of an empty key: %v, want lockerr.InvalidKey", err)
	}
	for _, target := range []string{"/key?k=", "/?k=" + strings.Repeat("x", lockfsm.MaxKeyLen+1)} {
		resp, body := get(t, h, "GET", target)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, lockerr.InvalidKey.Error()) {
			t.Errorf("GET %.20s: %d, want 400 with %q:\n%.300s", target, resp.StatusCode, lockerr.InvalidKey, body)
		}
	}
	if n := f.keysAsked(); n != 0 {
		t.Errorf("invalid keys reached the Source: %q", f.asked)
	}

	f.err = fmt.Errorf("shard 2: %w", lockerr.InvalidKey)
	if resp, _ := get(t, h, "GET", "/key?k=a"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("Source's invalid key: %d, want 400", resp.StatusCode)
	}
	f.err = fmt.Errorf("shard 2: %w", lockerr.Unavailable)
	if resp, _ := get(t, h, "GET", "/key?k=a"); resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("Source's other error: %d, want 503", resp.StatusCode)
	}
}

// TestUnderPrefix mounts the page below a path, as an application does,
// and follows every link, script, form and fetch the page and its script
// use: all relative, they must land on the handler's routes.
func TestUnderPrefix(t *testing.T) {
	h := New(newFakeSource(), nil)
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

// DNS rebinding: a web page the operator visits points a name of its own
// at 127.0.0.1 and reads the status page as its own origin; the browser
// still sends that name as Host. The page answers only to loopback
// addresses and localhost, and the hosts it was given.
func TestRefusesOtherHosts(t *testing.T) {
	f := newFakeSource()
	h := New(f, nil)
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
	if asked, want := f.keysAsked(), 5; asked != want { // /key?k= for the allowed hosts only
		t.Errorf("the source was asked %d key lookups, want %d: refused requests must not reach the cluster", asked, want)
	}

	// The hosts New is given are allowed too; the rest stay refused.
	named := New(f, []string{"lockmesh.ops.example"})
	for host, want := range map[string]int{
		"lockmesh.ops.example": http.StatusOK, "127.0.0.1:8080": http.StatusOK, "evil.example": http.StatusMisdirectedRequest,
	} {
		if resp, _ := getHost(t, named, "GET", host, "/status.json"); resp.StatusCode != want {
			t.Errorf("hosts: GET /status.json with Host %q: %d, want %d", host, resp.StatusCode, want)
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

func TestHumanDuration(t *testing.T) {
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
		if got := HumanDuration(tc.d); got != tc.want {
			t.Errorf("HumanDuration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	if got := AgeText(0, false); got != "unknown" {
		t.Errorf("AgeText(0) = %q, want unknown", got)
	}
	if got := AgeText(0, true); got != "≥0s" {
		t.Errorf("AgeText(0, at least) = %q", got)
	}
}
