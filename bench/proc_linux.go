package bench

import "syscall"

// procAttr kills the child when the bench process dies, so that even a
// kill -9 of the bench leaves no server behind.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
