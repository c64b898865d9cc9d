// Command lockbench benchmarks lockmesh: 3 peers in this process over
// loopback TCP, fsync on, with every op checked for mutual exclusion and
// fencing-token order. Comparisons with etcd, ZooKeeper and Redis run from
// the separate module in bench/compare.
//
//	go run ./bench/cmd/lockbench -systems lockmesh -workloads uncontended,contended -c 1,16,64 -d 10s -out results/
package main

import (
	"os"

	"github.com/lockmesh/lockmesh/bench"
)

func main() {
	os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr))
}
