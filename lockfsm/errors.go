package lockfsm

import "errors"

// ErrCorrupt is wrapped by every decoding error caused by malformed input:
// truncated data, wrong types, non-canonical encodings, sizes over a limit,
// or a snapshot whose contents contradict each other.
var ErrCorrupt = errors.New("corrupt input")

// ErrVersion is wrapped by decoding errors for input whose leading version
// byte is not one this release reads, such as data written by a newer one.
var ErrVersion = errors.New("unsupported format version")

// ErrUnsupported is wrapped by decoding errors for a command that uses an
// op or a field this release does not know: it was written by a newer
// release. A replica must stop applying rather than skip such an entry,
// since replicas that understand it would apply it and diverge.
var ErrUnsupported = errors.New("unsupported command")
