package lockfsm

import "errors"

// ErrCorrupt is wrapped by every decoding error caused by malformed input:
// truncated data, wrong types, non-canonical encodings, sizes over a limit,
// or a snapshot whose contents contradict each other.
var ErrCorrupt = errors.New("corrupt input")

// ErrVersion is wrapped by decoding errors for input whose leading version
// byte is not Version, such as data written by a newer release.
var ErrVersion = errors.New("unsupported format version")
