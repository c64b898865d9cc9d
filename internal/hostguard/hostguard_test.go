package hostguard

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAllowed(t *testing.T) {
	names := []string{"ops.example", "Peer-1.Internal.", "10.0.0.5", "[fd00::5]:9100"}
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1", true},
		{"127.0.0.1:9100", true},
		{"127.8.9.10:9100", true},
		{"[::1]:9100", true},
		{"[::1]", true},
		{"::1", true},
		{"[::ffff:127.0.0.1]:80", true},
		{"localhost", true},
		{"LocalHost:9100", true},
		{"localhost.:9100", true},
		{"ops.example", true},
		{"OPS.example:8080", true},
		{"peer-1.internal", true},
		{"10.0.0.5:9100", true},
		{"[fd00::5]:80", true},

		{"", false},
		{"evil.example", false},
		{"evil.example:9100", false},
		{"localhost.evil.example", false},
		{"127.0.0.1.evil.example", false},
		{"ops.example.evil.example", false},
		{"sub.ops.example", false},
		{"10.0.0.6:9100", false},
		{"0.0.0.0:9100", false},
		{"[::]:9100", false},
		{"192.168.1.2", false},
	} {
		if got := Allowed(tc.host, names); got != tc.want {
			t.Errorf("Allowed(%q) = %v, want %v", tc.host, got, tc.want)
		}
	}
	if Allowed("ops.example", nil) {
		t.Errorf("a name is allowed with no names given")
	}
	if Allowed("evil.example", []string{""}) {
		t.Errorf("an empty name allows everything")
	}
}

func TestHandler(t *testing.T) {
	served := 0
	h := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		io.WriteString(w, "secret")
	}), []string{"ops.example"}, "given to -http-host")
	get := func(host string) (*http.Response, string) {
		req := httptest.NewRequest("GET", "/status.json", nil)
		req.Host = host
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		body, _ := io.ReadAll(rec.Result().Body)
		return rec.Result(), string(body)
	}
	for _, host := range []string{"evil.example", "evil.example:9100", "", strings.Repeat("x", 5000)} {
		resp, body := get(host)
		if resp.StatusCode != http.StatusMisdirectedRequest || strings.Contains(body, "secret") {
			t.Errorf("Host %.20q: %d %q, want 421 and not the page", host, resp.StatusCode, body)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("Host %.20q: refusal is %q, want plain text", host, ct)
		}
		if !strings.Contains(body, "given to -http-host") || len(body) > 400 {
			t.Errorf("Host %.20q: refusal %q does not say how to allow a name, or is long", host, body)
		}
	}
	if _, body := get("evil.example:9100"); !strings.Contains(body, `Host "evil.example:9100" refused`) {
		t.Errorf("refusal %q does not name the host", body)
	}
	if served != 0 {
		t.Fatalf("the page was served %d times to refused hosts", served)
	}
	for _, host := range []string{"127.0.0.1:9100", "localhost", "ops.example:9100"} {
		if resp, body := get(host); resp.StatusCode != http.StatusOK || body != "secret" {
			t.Errorf("Host %q: %d %q, want the page", host, resp.StatusCode, body)
		}
	}
}
