package lockfsm_test

import (
	"bytes"
	"fmt"

	"github.com/lockmesh/lockmesh/lockfsm"
)

// A mutex handed from one session to the next waiter in the entry that
// releases it, with a higher fencing token.
func ExampleState_Apply() {
	s := lockfsm.New()
	rs, _ := s.Apply(1, []lockfsm.Command{
		{Op: lockfsm.OpOpenSession, Owner: "api-1", TTLMillis: 10_000},
		{Op: lockfsm.OpOpenSession, Owner: "api-2", TTLMillis: 10_000},
	})
	a, b := rs[0].Session, rs[1].Session

	rs, grants := s.Apply(2, []lockfsm.Command{
		{Op: lockfsm.OpAcquire, Session: a, Req: 1, Key: "invoice/42", Wait: true},
		{Op: lockfsm.OpAcquire, Session: b, Req: 1, Key: "invoice/42", Wait: true},
	})
	fmt.Println(rs[0].Status, rs[0].Token, rs[1].Status, len(grants))

	rs, grants = s.Apply(3, []lockfsm.Command{{Op: lockfsm.OpRelease, Session: a, Req: 2, Target: 1}})
	fmt.Println(rs[0].Status, grants[0].Owner, grants[0].Token)
	// Output:
	// Granted 1 Queued 1
	// OK api-2 2
}

// Command batches travel through Raft encoded.
func ExampleEncodeCommands() {
	b, err := lockfsm.EncodeCommands([]lockfsm.Command{{Op: lockfsm.OpAcquire, Session: 1, Req: 7, Key: "k"}})
	if err != nil {
		panic(err)
	}
	cmds, err := lockfsm.DecodeCommands(b)
	fmt.Println(len(b), cmds[0].Op, cmds[0].Key, err)
	_, err = lockfsm.DecodeCommands(b[:5])
	fmt.Println(err != nil)
	// Output:
	// 12 Acquire k <nil>
	// true
}

// A snapshot restores the state exactly, fencing counter included.
func ExampleState_Save() {
	s := lockfsm.New()
	s.Apply(1, []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "api-1", TTLMillis: 5000}})
	s.Apply(2, []lockfsm.Command{{Op: lockfsm.OpAcquire, Session: 1, Req: 1, Key: "k"}})
	var snap bytes.Buffer
	if err := s.Save(&snap); err != nil {
		panic(err)
	}
	restored := lockfsm.New()
	if err := restored.Load(bytes.NewReader(snap.Bytes())); err != nil {
		panic(err)
	}
	info, _ := restored.Key("k")
	fmt.Println(restored.Index(), info.Holders[0].Owner, restored.Stats().NextToken)
	// Output: 2 api-1 2
}

// Request answers a waiter that may have missed its grant notification.
func ExampleState_Request() {
	s := lockfsm.New()
	s.Apply(1, []lockfsm.Command{{Op: lockfsm.OpOpenSession, Owner: "api-1", TTLMillis: 5000}})
	s.Apply(2, []lockfsm.Command{{Op: lockfsm.OpAcquire, Session: 1, Req: 9, Key: "k"}})
	info, sessionFound := s.Request(1, 9)
	fmt.Println(sessionFound, info.Found, info.State, info.Token)
	_, sessionFound = s.Request(77, 9)
	fmt.Println(sessionFound)
	// Output:
	// true true Held 1
	// false
}
