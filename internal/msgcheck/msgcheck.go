// Package msgcheck guards msgpack decoding of untrusted bytes: RPC bodies and
// layouts come from the network and the disk, and msgpack v5 sizes what it
// allocates by the lengths the input claims.
package msgcheck

import (
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// MaxBody caps every RPC body and placement record lockmesh decodes from
// a peer or the disk.
const MaxBody = 4 << 20

// Unmarshal decodes b, untrusted bytes of at most limit, into v: it
// refuses a larger b and checks b's Shape before msgpack sees it.
func Unmarshal(b []byte, v any, limit int) error {
	if len(b) > limit {
		return fmt.Errorf("%d bytes, more than %d", len(b), limit)
	}
	if err := Shape(b); err != nil {
		return err
	}
	return msgpack.Unmarshal(b, v)
}

// MaxDepth bounds how deeply Shape lets msgpack containers nest:
// lockmesh's messages nest at most four deep (a layout: layout, replica
// map, replica list, replica); the rest is room for later fields.
const MaxDepth = 32

// Shape checks that b starts with one whole msgpack value whose
// arrays and maps claim no more elements than bytes remain (each element
// takes at least one), whose strings and binaries fit in what remains, and
// whose containers nest at most MaxDepth deep. msgpack v5.4.1 makes
// a slice as long as an array claims before it reads an element (its
// allocation limit never applies: decode_slice.go tests the flag against
// 1), so nine bytes claiming 4G peers would ask for 160 GB and kill the
// process. After this check what Decode allocates is bounded by a small
// multiple of len(b), and msgpack's recursion by MaxDepth. Call it
// before msgpack.Unmarshal of any bytes from the network or the disk.
func Shape(b []byte) error {
	truncated := errors.New("truncated msgpack value")
	pending := []int{1} // values still to read at each open level
	i := 0
	// size reads the big-endian length of w bytes at i.
	size := func(w int) (uint64, error) {
		if w > len(b)-i {
			return 0, truncated
		}
		var n uint64
		for _, c := range b[i : i+w] {
			n = n<<8 | uint64(c)
		}
		i += w
		return n, nil
	}
	for len(pending) > 0 {
		top := len(pending) - 1
		if pending[top] == 0 {
			pending = pending[:top]
			continue
		}
		pending[top]--
		if i >= len(b) {
			return truncated
		}
		c := b[i]
		i++
		var elems, skip uint64 // elems of a container; skip bytes of payload
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
			// fixint, nil, false, true: the code is the value
		case c >= 0x80 && c <= 0x8f:
			elems = 2 * uint64(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			elems = uint64(c & 0x0f)
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		case c == 0xc4 || c == 0xd9: // bin8, str8
			skip, err = size(1)
		case c == 0xc5 || c == 0xda: // bin16, str16
			skip, err = size(2)
		case c == 0xc6 || c == 0xdb: // bin32, str32
			skip, err = size(4)
		case c == 0xc7: // ext8: length, type, data
			skip, err = size(1)
			skip++
		case c == 0xc8: // ext16
			skip, err = size(2)
			skip++
		case c == 0xc9: // ext32
			skip, err = size(4)
			skip++
		case c == 0xcc || c == 0xd0:
			skip = 1
		case c == 0xcd || c == 0xd1:
			skip = 2
		case c == 0xca || c == 0xce || c == 0xd2:
			skip = 4
		case c == 0xcb || c == 0xcf || c == 0xd3:
			skip = 8
		case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type, data
			skip = 1 + 1<<(c-0xd4)
		case c == 0xdc:
			elems, err = size(2)
		case c == 0xdd:
			elems, err = size(4)
		case c == 0xde:
			elems, err = size(2)
			elems *= 2
		case c == 0xdf:
			elems, err = size(4)
			elems *= 2
		default:
			return fmt.Errorf("invalid msgpack code %#x", c)
		}
		if err != nil {
			return err
		}
		if skip > uint64(len(b)-i) {
			return truncated
		}
		i += int(skip)
		if elems > 0 {
			if elems > uint64(len(b)-i) {
				return fmt.Errorf("a msgpack container claims %d elements in %d bytes", elems, len(b)-i)
			}
			if len(pending) > MaxDepth {
				return fmt.Errorf("msgpack containers nest deeper than %d", MaxDepth)
			}
			pending = append(pending, int(elems))
		}
	}
	return nil
}
