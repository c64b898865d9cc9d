package gocronlock_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/lockmesh/lockmesh/adapters/gocronlock"
	"github.com/lockmesh/lockmesh/node"
)

// startExamplePeer starts a one-peer cluster on 127.0.0.1 in a temporary
// directory; in an application, every instance starts its node.Node and
// they Join one another.
func startExamplePeer() (*node.Node, func()) {
	dir, err := os.MkdirTemp("", "gocronlock-example-")
	if err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	raft := l.Addr().String()
	l.Close()
	n, err := node.Start(context.Background(), node.Config{
		Name:              "example",
		DataDir:           dir,
		GossipAddr:        "127.0.0.1:0",
		RaftAddr:          raft,
		RPCAddr:           "127.0.0.1:0",
		BootstrapExpect:   1,
		ReplicationFactor: 1,
		Shards:            2,
		RTT:               10 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	<-n.Ready()
	return n, func() { n.Close(); os.RemoveAll(dir) }
}

// Every instance runs the same scheduler with an Elector of the same
// election; only the leader's scheduler runs the jobs. A job fences what
// it writes on the leadership's term, and stops when the leadership ends.
func ExampleNewElector() {
	n, stop := startExamplePeer()
	defer stop()
	ctx := context.Background()
	s, err := n.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close(ctx)

	el, err := gocronlock.NewElector(ctx, s, "election/cron", []byte("worker-1"))
	if err != nil {
		log.Fatal(err)
	}
	defer el.Close(ctx) // resigns: another instance leads at once
	sched, err := gocron.NewScheduler(gocron.WithDistributedElector(el))
	if err != nil {
		log.Fatal(err)
	}
	defer sched.Shutdown()

	// For the example only: lead before the job is due, so that it runs.
	if _, err := el.WaitLeader(ctx); err != nil {
		log.Fatal(err)
	}
	compact := func(ctx context.Context, term uint64) {
		// Writes carry term, and the store refuses older ones (node.Fence).
		fmt.Println("compacting as the leader, fenced on term", term)
	}
	done := make(chan struct{})
	_, err = sched.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), gocron.NewTask(func() {
		defer close(done)
		ld, err := el.Leadership()
		if err != nil {
			return // the leadership ended since gocron asked
		}
		compact(ld.Context(ctx), ld.Term()) // the context ends with the leadership
	}), gocron.WithName("compact"))
	if err != nil {
		log.Fatal(err)
	}
	sched.Start()
	<-done
	// Output: compacting as the leader, fenced on term 1
}

// With a Locker every instance's scheduler may run a job, but a run is
// skipped while another instance's run of the same job holds its lock.
func ExampleNewLocker() {
	n, stop := startExamplePeer()
	defer stop()

	sched, err := gocron.NewScheduler(gocron.WithDistributedLocker(
		gocronlock.NewLocker(n, gocronlock.WithKeyPrefix("cron/"))))
	if err != nil {
		log.Fatal(err)
	}
	defer sched.Shutdown()
	done := make(chan struct{})
	_, err = sched.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), gocron.NewTask(func() {
		defer close(done)
		info, err := n.Inspect(context.Background(), "cron/report")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("reporting, holders of cron/report:", len(info.Holders))
	}), gocron.WithName("report")) // the lock's key: cron/report
	if err != nil {
		log.Fatal(err)
	}
	sched.Start()
	<-done
	// Output: reporting, holders of cron/report: 1
}
