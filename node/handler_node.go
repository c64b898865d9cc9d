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
func (n *Node) Handler() http.Handler { return newStatusHandler(n) }
