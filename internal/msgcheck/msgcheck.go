// Package msgcheck guards msgpack decoding of untrusted bytes: RPC bodies and
// layouts come from the network and the disk, and msgpack v5 sizes what it
// allocates by the lengths the input claims.
package msgcheck

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// MaxBody caps every RPC body and placement record lockmesh decodes from
// a peer or the disk.
const MaxBody = 4 << 20

// DecodedFactor bounds what a body may cost once decoded: Unmarshal
// refuses bytes of at most limit whose decoded estimate (see ShapeWithin)
// exceeds DecodedFactor*limit, and Shape bytes whose estimate exceeds
// DecodedFactor*MaxBody.
const DecodedFactor = 4

// ElemCost is what Shape charges each array element and each map key and
// value when the Go type the bytes decode into is not known: more than
// lockmesh's records (a layout replica, a grant) take in memory.
const ElemCost = 64

// Unmarshal decodes b, untrusted bytes of at most limit, into v: it
// refuses a larger b, and checks b with ShapeWithin before msgpack sees
// it, charging every element the largest value v's type can allocate for
// one (elemCost) against a budget of DecodedFactor*limit decoded bytes.
// A body of 4 MiB of nils decoded into []T is refused before any T is
// allocated. What msgpack then allocates is at most about twice the
// budget (slices grow by doubling), unless v's type has custom decoders,
// which are on their own.
func Unmarshal(b []byte, v any, limit int) error {
	if len(b) > limit {
		return fmt.Errorf("%d bytes, more than %d", len(b), limit)
	}
	if err := ShapeWithin(b, elemCost(reflect.TypeOf(v)), DecodedFactor*limit); err != nil {
		return err
	}
	return msgpack.Unmarshal(b, v)
}

// MaxDepth bounds how deeply Shape lets msgpack containers nest:
// lockmesh's messages nest at most four deep (a layout: layout, replica
// map, replica list, replica); the rest is room for later fields.
const MaxDepth = 32

// Shape is ShapeWithin(b, ElemCost, DecodedFactor*MaxBody), for bytes
// whose Go type the caller does not name.
func Shape(b []byte) error { return ShapeWithin(b, ElemCost, DecodedFactor*MaxBody) }

// ShapeWithin checks that b starts with one whole msgpack value whose
// arrays and maps claim no more elements than bytes remain (each element
// takes at least one), whose strings and binaries fit in what remains, and
// whose containers nest at most MaxDepth deep. msgpack v5.4.1 makes
// a slice as long as an array claims before it reads an element (its
// allocation limit never applies: decode_slice.go tests the flag against
// 1), so nine bytes claiming 4G peers would ask for 160 GB and kill the
// process. After this check what Decode allocates is bounded by a small
// multiple of len(b), and msgpack's recursion by MaxDepth.
//
// A small multiple of len(b) is not small enough: a nil takes one byte
// on the wire and a whole struct once decoded into a slice of them. So
// ShapeWithin also estimates the decoded size, elemCost bytes for every
// array element and every map key and value, plus the length of every
// string and binary (extensions are refused), and refuses b when it exceeds
// budget, before msgpack allocates anything. Call it (or Shape, or
// Unmarshal) before msgpack.Unmarshal of any bytes from the network or
// the disk.
func ShapeWithin(b []byte, elemCost, budget int) error {
	truncated := errors.New("truncated msgpack value")
	pending := []int{1} // values still to read at each open level
	i := 0
	var decoded uint64 // the estimate so far, never above limit+len(b)
	cost, limit := uint64(max(elemCost, 1)), uint64(max(budget, 0))
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
		case c >= 0xc7 && c <= 0xc9 || c >= 0xd4 && c <= 0xd8:
			// Extensions: lockmesh writes none, and msgpack does not
			// treat them as opaque. Decoding a map it skips an extension's
			// header and reads its payload, and what follows, as the map,
			// so a payload this check skipped could claim 4G elements.
			return fmt.Errorf("msgpack extension %#x: lockmesh's formats have none", c)
		case c == 0xcc || c == 0xd0:
			skip = 1
		case c == 0xcd || c == 0xd1:
			skip = 2
		case c == 0xca || c == 0xce || c == 0xd2:
			skip = 4
		case c == 0xcb || c == 0xcf || c == 0xd3:
			skip = 8
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
		decoded += skip
		if elems > 0 {
			if elems > uint64(len(b)-i) {
				return fmt.Errorf("a msgpack container claims %d elements in %d bytes", elems, len(b)-i)
			}
			if decoded > limit || elems > (limit-decoded)/cost {
				return fmt.Errorf("%d bytes decode into more than %d (%d bytes for each element)", len(b), limit, cost)
			}
			if len(pending) > MaxDepth {
				return fmt.Errorf("msgpack containers nest deeper than %d", MaxDepth)
			}
			decoded += elems * cost
			pending = append(pending, int(elems))
		}
	}
	if decoded > limit {
		return fmt.Errorf("%d bytes decode into more than %d", len(b), limit)
	}
	return nil
}

// minElemCost is the least elemCost charges: a slice element of a word,
// with room for msgpack's own bookkeeping.
const minElemCost = 16

// anyCost is what one element decoded into an interface costs: the
// interface, and the boxed value or map msgpack makes for it.
const anyCost = 64

// mapEntryCost is a Go map's overhead for one entry, beyond its key and
// value.
const mapEntryCost = 16

var elemCosts sync.Map // reflect.Type -> int

// elemCost is the most one msgpack element can make msgpack allocate when
// decoding into t: the largest slice element, map entry, pointed-to value
// or interface reachable from t, and at least minElemCost. Every value
// that allocates is an element of some container (struct fields are map
// entries or array elements on the wire), so charging each element this
// much bounds what decoding allocates.
func elemCost(t reflect.Type) int {
	if t == nil {
		return anyCost
	}
	if c, ok := elemCosts.Load(t); ok {
		return c.(int)
	}
	c := max(minElemCost, int(largestUnit(t, map[reflect.Type]bool{})))
	elemCosts.Store(t, c)
	return c
}

// largestUnit is the largest single allocation decoding into t can make
// for one element, following t's slices, maps, pointers and fields.
func largestUnit(t reflect.Type, seen map[reflect.Type]bool) uintptr {
	if seen[t] {
		return 0
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice:
		return max(t.Elem().Size(), largestUnit(t.Elem(), seen))
	case reflect.Array:
		return largestUnit(t.Elem(), seen)
	case reflect.Map:
		entry := t.Key().Size() + t.Elem().Size() + mapEntryCost
		return max(entry, anyCost, largestUnit(t.Key(), seen), largestUnit(t.Elem(), seen))
	case reflect.Struct:
		var u uintptr
		for i := range t.NumField() {
			u = max(u, largestUnit(t.Field(i).Type, seen))
		}
		return u
	case reflect.Interface:
		return anyCost
	}
	return 0
}
