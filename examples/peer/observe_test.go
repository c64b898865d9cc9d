package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockmesh/lockmesh/node"
)

// TestHTTPHosts serves the -http endpoints of an in-process peer and asks
// each for hosts a browser could send. DNS rebinding: a web page the
// operator visits points a name of its own at the listener and reads
// status.json, /key?k=..., /metrics or /debug/pprof/ as its own origin.
// Only loopback, localhost, -http's own host and -http-host's names are
// answered.
func TestHTTPHosts(t *testing.T) {
	cfg, err := parseFlags([]string{"-data", t.TempDir(), "-gossip", "127.0.0.1:0", "-raft", freeLoopbackAddr(t),
		"-rpc", "127.0.0.1:0", "-name", "h1", "-expect", "1", "-shards", "1", "-rf", "1",
		"-http", "127.0.0.2:0", "-http-host", "peer-1.ops.example, Grafana.ops.example"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := node.Start(ctx, cfg.node)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	select {
	case <-n.Ready():
	case <-ctx.Done():
		t.Fatal("the peer is not ready after 20s")
	}
	srv := httptest.NewServer(newHTTPHandler(n, prometheus.NewRegistry(), httpHosts(cfg)))
	defer srv.Close()
	noRedirect := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	paths := []string{"/", "/metrics", "/debug/lockmesh/status.json", "/debug/lockmesh/key?k=a", "/debug/pprof/"}
	get := func(path, host string) (int, []byte) {
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		req.Host = host
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	for _, host := range []string{"evil.example", "evil.example:9100", "ops.example", "127.0.0.1.evil.example"} {
		for _, path := range paths {
			status, body := get(path, host)
			if status != http.StatusMisdirectedRequest || !strings.Contains(string(body), "-http-host") {
				t.Errorf("GET %s with Host %q: %d %.200q, want 421 saying how to allow a name", path, host, status, body)
			}
		}
	}
	for _, host := range []string{"", "127.0.0.2:9100", "localhost:9100", "[::1]:9100", "peer-1.ops.example:9100", "grafana.ops.example"} {
		for _, path := range paths {
			status, _ := get(path, host)
			if want := map[bool]int{true: http.StatusFound, false: http.StatusOK}[path == "/"]; status != want {
				t.Errorf("GET %s with Host %q: %d, want %d", path, host, status, want)
			}
		}
	}
}

// freeLoopbackAddr returns 127.0.0.1 with a port free for now.
func freeLoopbackAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
