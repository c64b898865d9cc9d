package transport

import (
	"errors"
	"fmt"
)

// CodeInternal is the Error code for a handler failure that was not an
// *Error, for a handler panic, and for a response too large to send.
// Codes 1-99 are reserved for transport; codes >= 100 are free for the
// application.
const CodeInternal uint16 = 1

var (
	// ErrClosed is returned by Client.Call once the Client is closed,
	// including by calls that were in flight when Close was called.
	ErrClosed = errors.New("transport: closed")

	// ErrUnavailable is wrapped by Client.Call errors that mean the peer
	// could not be reached or the connection broke before the response
	// arrived. The request may or may not have been handled by the peer:
	// retry only requests that are idempotent.
	ErrUnavailable = errors.New("transport: peer unavailable")

	// ErrFrameTooLarge is wrapped by errors about a frame above the
	// configured MaxFrameSize: Client.Call returns it, without sending
	// anything, for a request that does not fit.
	ErrFrameTooLarge = errors.New("transport: frame too large")
)

// Error is an error returned by a remote Handler. Client.Call returns it
// with the Code and Message the handler chose; compare codes, not messages.
type Error struct {
	Code    uint16
	Message string
}

// Error returns the message and code.
func (e *Error) Error() string {
	return fmt.Sprintf("transport: remote error %d: %s", e.Code, e.Message)
}

// unavailable wraps cause so that errors.Is matches both ErrUnavailable and
// the cause (for example a *net.OpError).
func unavailable(addr string, cause error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, addr, cause)
}
