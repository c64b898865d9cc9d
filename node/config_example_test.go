package node_test

import (
	"errors"
	"fmt"

	"github.com/lockmesh/lockmesh/node"
)

// DefaultConfig fills in the tuning defaults only; a peer still needs a
// data dir, its addresses and a way into a cluster.
func ExampleDefaultConfig() {
	cfg := node.DefaultConfig()
	fmt.Println(cfg.Shards, cfg.ReplicationFactor, cfg.SessionTTL, cfg.LeaseMargin, cfg.RaftAddr == "")
	fmt.Println(errors.Is(cfg.Validate(), node.ErrInvalidConfig))

	cfg.Name = "p1"
	cfg.DataDir = "/var/lib/lockmesh"
	cfg.GossipAddr, cfg.RaftAddr, cfg.RPCAddr = "127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"
	cfg.BootstrapExpect = 3
	fmt.Println(cfg.Validate())
	// Output:
	// 16 3 10s 1s true
	// true
	// <nil>
}
