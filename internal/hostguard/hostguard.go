// Package hostguard keeps a web page served on an operator's machine from
// answering requests that name another host: the defence against DNS
// rebinding. A web page the operator visits can point a name of its own
// at 127.0.0.1 and then read, as same-origin, whatever a local server
// answers for that name; the browser still sends the attacker's name in
// the Host header, which is what this package checks.
//
// A request is allowed when its Host (with or without a port) is a
// loopback address literal (127.0.0.0/8, ::1), "localhost", or one of the
// names the server was told it answers to. Everything else gets 421
// Misdirected Request. The rules are pure and tested without a server.
package hostguard

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// Allowed reports whether host, a request's Host ("name", "name:port",
// "[::1]:port"), is a loopback address literal, "localhost", or one of
// names. Names are host names or IP addresses; a port on either side is
// ignored, and names compare case-insensitively, with or without a
// trailing dot. An empty host is not allowed.
func Allowed(host string, names []string) bool {
	h := normalize(host)
	if h == "" {
		return false
	}
	if h == "localhost" {
		return true
	}
	if ip, err := netip.ParseAddr(h); err == nil && ip.Unmap().IsLoopback() {
		return true
	}
	for _, n := range names {
		if n := normalize(n); n != "" && n == h {
			return true
		}
	}
	return false
}

// normalize strips a port, IPv6 brackets and a trailing dot, and lowers
// the case, so that one host written two ways compares equal.
func normalize(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// Refuse answers a request whose Host is not allowed: 421 Misdirected
// Request with a short plain-text message naming the host (quoted, at
// most 100 bytes of it) and hint, which says how to allow a name.
func Refuse(w http.ResponseWriter, host, hint string) {
	if len(host) > 100 {
		host = host[:100] + "..."
	}
	msg := fmt.Sprintf("Host %q refused: this page answers only to loopback addresses, localhost and the names %s (a guard against DNS rebinding)", host, hint)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	http.Error(w, msg, http.StatusMisdirectedRequest)
}

// Handler returns h behind the check: a request whose Host is not
// Allowed by names is refused (Refuse, with hint) before h sees it.
func Handler(h http.Handler, names []string, hint string) http.Handler {
	names = append([]string(nil), names...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Allowed(r.Host, names) {
			Refuse(w, r.Host, hint)
			return
		}
		h.ServeHTTP(w, r)
	})
}
