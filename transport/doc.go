// Package transport is lockmesh's node-to-node RPC: request/response calls
// multiplexed over one TCP connection per peer, optionally with (mutual)
// TLS.
//
// transport knows nothing about locks. A request carries an opaque method
// number and an opaque body; a Server hands both to its Handler and sends
// back the bytes or the *Error the Handler returns. A Client keeps one
// connection per remote address, dials it on the first Call and redials on
// the next Call after it breaks.
//
// # Delivery
//
// A Call that returns a response or an *Error was handled exactly once. A
// Call that fails with ErrUnavailable after the connection was established,
// or with ctx.Err(), may or may not have been handled: the caller must make
// such requests idempotent (lockmesh requests carry a session and request
// id) and retry them. There is no retry inside transport except for a
// request that provably never left this process.
//
// # Wire format
//
// A connection carries frames in both directions. Every frame is
//
//	length  uint32, big-endian: the number of body bytes that follow
//	body    Version byte (1), then a msgpack array of 6 elements:
//	        [kind, call id, method, error code, error message, payload]
//
// with kind a uint (1 = request, 2 = response), call id a uint64 chosen by
// the client and echoed by the server, method a uint8, error code a uint16
// (0 = success), error message a str and payload a bin (never nil). Integers
// use msgpack's shortest unsigned encoding. A response with a non-zero code
// carries an error and an empty payload.
//
// A receiver closes the connection, logging the peer address and the
// reason, when a length exceeds its MaxFrameSize, when the version or kind
// is unknown, or when the body is not exactly such an array. Calls in flight
// on that connection fail with ErrUnavailable. Every length inside a body is
// checked against the bytes remaining before anything is allocated, so a
// frame never costs more memory than its own size. A response for an
// unknown call id (its caller gave up) is dropped.
//
// Requests and responses on one connection may be interleaved in any
// order; a Server runs each request on its own goroutine.
//
// # Limits
//
// A connection is unproven from its accept until it proves itself: with
// TLS by completing its handshake, without TLS by sending a valid first
// request. It must do so within HandshakeTimeout (5 s); until then it
// holds one of MaxUnprovenConns (256) slots, at most MaxConnsPerIP (128)
// of them from one IP address, and is never refused: a new connection
// makes room by closing its address's oldest unproven one, or the oldest
// of all. Connections that stall before or in their handshake therefore
// cannot keep a peer out (internal/connslots states the rules).
//
// Proven connections are capped at MaxConns (1024). With TLS and
// Config.Known, the verified certificate tells a member's connection
// from a stranger's; strangers share only MaxConns-ReservedConns
// (ReservedConns defaults to MaxConns/4) and MaxConnsPerIP from one
// address, so they cannot keep members out, whatever address they come
// from. Without TLS nobody can prove who it is (127.0.0.1 is every local
// process): every connection is a stranger's, and whoever can send valid
// requests from a peer's address shares that address's MaxConnsPerIP
// slots with it. A plaintext cluster, on one host or not, trusts every
// process that can reach its ports. One proven over its caps is closed
// before its first request is handled.
//
// After its first frame, a connection that has neither sent a frame nor
// had a request answered for IdleTimeout (2 min) is closed, and a frame
// that has begun must arrive whole, and a batch of responses be written,
// within IdleTimeout (at least half of it). A Client closes a pooled
// connection that has had no call for IdleTimeout/2, before the server
// would, and redials on the next call, so idle closes never fail a call
// when both ends use the same IdleTimeout.
//
// A connection holds at most MaxPendingBytes (8 MiB) of request bodies
// being handled and responses not yet written, plus one frame; at that it
// reads no more requests until its peer reads.
package transport
