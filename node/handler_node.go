// Node's status page: Handler, and its options (HandlerOption,
// WithAllowedHosts). The page itself is internal/statuspage.

package node

import "net/http"

// Handler returns a read-only http.Handler with the peer's status page,
// for the application to mount where it serves its own operator pages,
// as with net/http/pprof and expvar:
//
//	mux.Handle("/debug/lockmesh/", http.StripPrefix("/debug/lockmesh", n.Handler()))
//
// Relative to where it is mounted it serves:
//
//   - "/": an HTML page of this peer's Status (members; shards with their
//     leader, replicas and counts), the cluster's most contended keys and
//     longest holds (Top), and a key lookup (Inspect) through ?k=KEY. It
//     refreshes itself every 2 s from the endpoints below.
//   - "/status.json": Status as JSON.
//   - "/top.json?k=N": Top of N keys (default 10, 1 to 100) as JSON.
//   - "/key?k=KEY": KeyInfo of KEY as JSON.
//
// The JSON's field names are snake_case (peer, members, shards,
// contended, longest_holds, holders, waiters, ...); durations come in
// milliseconds (a field ending in _ms) and as text; session and cluster
// ids are strings, too large for JavaScript's numbers. Errors are
// {"error": "..."}: 400 for a bad k, 503 when the cluster did not answer
// within 5 s. Only GET and HEAD are served.
//
// The page shows key names, peer addresses, sessions and fencing tokens:
// mount it only where operators alone reach it (a loopback or admin
// listener, or behind the application's own authentication), never on a
// public listener. It changes nothing, but every request asks the
// cluster, so keep it away from untrusted clients for load too.
//
// It answers only requests whose Host is a loopback address
// (127.0.0.0/8, ::1) or "localhost", with any port, and the names given
// with WithAllowedHosts; any other Host gets 421 Misdirected Request, a
// plain-text line naming it, before the cluster is asked anything. This
// keeps a web page the operator visits from pointing a name of its own at
// the listener (DNS rebinding) and reading the page as its own.
func (n *Node) Handler(opts ...HandlerOption) http.Handler { return newStatusHandler(n, opts...) }

// HandlerOption configures Handler.
type HandlerOption func(*handlerOptions)

type handlerOptions struct {
	hosts []string
}

// WithAllowedHosts lets Handler answer requests addressed to hosts too,
// besides loopback addresses and localhost: the names (or IP addresses)
// operators reach the application's listener by, as in
// WithAllowedHosts("app-7.ops.example"). A port is ignored; names
// compare case-insensitively. Allow only names the application's own
// DNS controls: any other is what DNS rebinding uses. Options add up.
func WithAllowedHosts(hosts ...string) HandlerOption {
	return func(o *handlerOptions) { o.hosts = append(o.hosts, hosts...) }
}
