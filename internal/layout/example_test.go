package layout_test

import (
	"fmt"

	"github.com/lockmesh/lockmesh/internal/layout"
)

func ExamplePlacement_ShardOf() {
	peers := []layout.Peer{{Name: "api-1", NodeHostID: "nh-1"}, {Name: "api-2", NodeHostID: "nh-2"}, {Name: "api-3", NodeHostID: "nh-3"}}
	tagged := layout.New(1, 16, 3, layout.KeySchemeHashTag, peers)
	whole := layout.New(1, 16, 3, layout.KeySchemeWhole, peers) // a cluster created before hash tags

	for _, key := range []string{"{order-42}/items", "{order-42}/payment", "order-42", "{}x"} {
		fmt.Printf("%-20q hash tags: shard %2d   whole key: shard %2d\n", key, tagged.ShardOf(key), whole.ShardOf(key))
	}
	// Output:
	// "{order-42}/items"   hash tags: shard  6   whole key: shard 11
	// "{order-42}/payment" hash tags: shard  6   whole key: shard  5
	// "order-42"           hash tags: shard  6   whole key: shard  6
	// "{}x"                hash tags: shard  9   whole key: shard  9
}
