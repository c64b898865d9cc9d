package peer

import (
	"testing"

	"github.com/lockmesh/lockmesh/internal/layout"
	"github.com/lockmesh/lockmesh/mesh"
)

// A gossip member is the peer the layout means only if it gossips the
// NodeHostID the layout lists under its name, or a name the layout does
// not list.
func TestSameIdentity(t *testing.T) {
	p := layout.New(1, 1, 3, layout.KeySchemeHashTag, []layout.Peer{{Name: "a", NodeHostID: "id-a"}, {Name: "b", NodeHostID: "id-b"}, {Name: "c", NodeHostID: "id-c"}})
	for _, tc := range []struct {
		name, hostID string
		same         bool
	}{
		{"a", "id-a", true},      // the listed identity
		{"d", "id-d", true},      // a name the layout does not list: a new peer
		{"d", "id-a", true},      // the name decides, not the id
		{"b", "id-wiped", false}, // a listed name with a new data dir
		{"a", "id-b", false},     // a listed name with another listed peer's data dir
		{"c", "", false},         // a listed name not gossiping its NodeHostID yet
		{"a", "ID-A", false},     // ids compare exactly
	} {
		m := mesh.Member{Name: tc.name, Meta: mesh.Meta{NodeHostID: tc.hostID}}
		if got := sameIdentity(p, m); got != tc.same {
			t.Errorf("sameIdentity(%q, %q) = %v, want %v", tc.name, tc.hostID, got, tc.same)
		}
	}
}
