// Command compare runs lockmesh's benchmark harness against the lock
// services people would otherwise deploy: etcd (embedded 3-member cluster,
// clientv3 concurrency.Mutex, and recipes.RWMutex for the read/write
// workload), a 3-server ZooKeeper ensemble (the
// sequential-ephemeral lock recipe), Redis with appendfsync always
// (redsync) and Redlock over 3 such Redis (redsync). It is its own module so
// that lockmesh's go.mod never depends on their clients.
//
//	bash bench/install-peers.sh   # redis-server and zookeeper, from Debian
//	cd bench/compare && go run . -systems lockmesh,etcd,zookeeper,redis,redlock -workloads uncontended,contended -c 1,16,64 -d 10s -out ../../bench/results
//
// Systems whose server binaries are missing are skipped with a note. Every
// server binds to 127.0.0.1 and is stopped by process id when the run ends,
// also on Ctrl-C.
package main

import (
	"os"

	"github.com/lockmesh/lockmesh/bench"
)

func main() {
	bench.Register("etcd", newEtcd)
	bench.Register("zookeeper", newZooKeeper)
	bench.Register("redis", newRedis(1))
	bench.Register("redlock", newRedis(3))
	os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr))
}
