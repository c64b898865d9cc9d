package main

import "syscall"

// procAttr has the kernel kill a child when the demo dies, so that even a
// kill -9 of the demo leaves no peer behind. (Pdeathsig fires when the
// thread that started the child exits; the Go runtime ends a thread only
// when a goroutine locked to it returns, which the demo never does.) The
// child gets a process group of its own, so that a Ctrl-C in the terminal
// reaches the demo only, which then stops its children itself.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}
