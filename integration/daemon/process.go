package daemon

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// LogFile is where a process the tests run (containerd, kubelet, a
// snapshotter) writes its output.
type LogFile string

// Text returns everything logged so far.
func (f LogFile) Text() string {
	b, _ := os.ReadFile(string(f))
	return string(b)
}

// Tail returns the last n lines logged.
func (f LogFile) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(f.Text(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Terminate sends cmd SIGTERM and waits for exited (closed once cmd.Wait
// returns); after grace it kills cmd's process group, which it must lead
// (Setpgid), and waits again. It reports whether it had to kill.
func Terminate(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration) (killed bool) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return false
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		return true
	}
}
