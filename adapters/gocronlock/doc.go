// Package gocronlock lets gocron (github.com/go-co-op/gocron/v2) schedule
// jobs across the instances of an application with lockmesh: an Elector
// for gocron.WithDistributedElector, and a Locker for
// gocron.WithDistributedLocker and gocron.WithDistributedJobLocker.
//
// With an Elector only the leader of a lockmesh election runs jobs: every
// instance schedules them, and before each run gocron asks IsLeader, which
// answers nil only while this instance's leadership holds. Leadership
// passes on at once when the leader resigns (Close) and within the
// session TTL when it crashes. A job that starts just before the
// leadership ends still runs, while the next leader runs its own jobs:
// pass the term (Elector.Leadership, Leadership.Term) to what the job
// writes to, as a fencing token (node.Fence), and stop the job at the
// leadership's Context.
//
// With a Locker every instance may run jobs, and each run first tries the
// lock of the job's name once: an instance that finds it held skips that
// run. gocron's Locker documentation explains the limits: instances whose
// timers fire at slightly different times may each run the job in turn for
// the same tick. Prefer the Elector when that matters.
//
// Only this package imports gocron; package node does not.
package gocronlock
