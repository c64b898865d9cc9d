package bench

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is a server process started by a System. Stop it with Stop; the
// harness's CLI also stops every Proc still running when it is interrupted.
type Proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

var (
	procsMu sync.Mutex
	procs   = map[*Proc]bool{}
)

// StartProc starts name with args in dir, its output appended to logPath.
// On Linux the child is also killed if the bench process dies without
// stopping it.
func StartProc(dir, logPath, name string, args ...string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	procsMu.Lock()
	procs[p] = true
	procsMu.Unlock()
	go func() {
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the process by its id, waits up to 5s, then kills
// it. It is idempotent.
func (p *Proc) Stop() {
	procsMu.Lock()
	delete(procs, p)
	procsMu.Unlock()
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// StopAllProcs stops every Proc not stopped yet. The CLI calls it on exit,
// including after Ctrl-C.
func StopAllProcs() {
	procsMu.Lock()
	var ps []*Proc
	for p := range procs {
		ps = append(ps, p)
	}
	procsMu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop()
		}()
	}
	wg.Wait()
}

// tail returns the last n bytes of a log file, for error messages.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// LogTail returns the last 2 KB of a server's log file.
func LogTail(path string) string { return tail(path, 2048) }
