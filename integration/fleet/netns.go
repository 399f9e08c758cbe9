package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every network namespace a fleet makes:
// Prefix, the test process's PID, a sequence number and the member, as in
// "pwfleet-4242-1-n0". Links need no prefix: every one of them (the
// bridge and both ends of each veth) lives inside those namespaces, so
// the host's own namespace never gets an interface, an address or a
// route, and removing the namespaces removes them all.
const Prefix = "pwfleet-"

// netnsDir is where `ip netns` keeps its named namespaces.
const netnsDir = "/var/run/netns/"

var seq atomic.Int64

// newID names a fleet: unique among the fleets of this process, and
// never one a crashed earlier run left behind, whose PID is another.
func newID() string {
	return fmt.Sprintf("%s%d-%d", Prefix, os.Getpid(), seq.Add(1))
}

// ip runs the ip or tc tool and returns its error with its output.
func ip(tool string, args ...string) error {
	out, err := exec.Command(tool, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Namespaces lists the named network namespaces whose name starts with
// prefix.
func Namespaces(prefix string) ([]string, error) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return nil, fmt.Errorf("ip netns list: %w", err)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		// "name" or "name (id: 3)"
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// removeNamespace kills what still runs in ns and deletes it; its links
// go with it.
func removeNamespace(ns string) error {
	if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	return ip("ip", "netns", "del", ns)
}

var (
	sweepOnce sync.Once
	sweepErr  error
)

// sweepLeftovers removes, once a process, what runs that are gone left.
func sweepLeftovers() error {
	sweepOnce.Do(func() { sweepErr = sweep() })
	return sweepErr
}

// sweep removes the namespaces that runs which are gone left behind (a
// test binary killed before its cleanups ran). Namespaces of processes
// still alive, another test binary's, are left alone.
func sweep() error {
	names, err := Namespaces(Prefix)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range names {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(ns, Prefix), "-")
		pid, err := strconv.Atoi(pidText)
		if err == nil && (pid == os.Getpid() || alive(pid)) {
			continue
		}
		errs = append(errs, removeNamespace(ns))
	}
	return errors.Join(errs...)
}

// alive reports whether process pid runs: it exists and is no zombie,
// as a test binary killed a moment ago may still be.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command, which is in parentheses.
	state := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(state) > 0 && state[0] != "Z" && state[0] != "X"
}

// link joins namespace member to the bridge in namespace hub with a veth
// pair: port in hub, eth0 in member with addr (CIDR), loopback up too.
func link(hub, port, member, addr string) error {
	for _, cmd := range [][]string{
		{"-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", member},
		{"-n", hub, "link", "set", port, "master", "br0", "up"},
		{"-n", member, "addr", "add", addr, "dev", "eth0"},
		{"-n", member, "link", "set", "eth0", "up"},
		{"-n", member, "link", "set", "lo", "up"},
	} {
		if err := ip("ip", cmd...); err != nil {
			return err
		}
	}
	return nil
}

// listenIn opens a TCP listener on addr inside network namespace ns. A
// socket belongs to the namespace it was made in for all its life, so
// only this call switches namespace: on a goroutine locked to its OS
// thread, which switches back before it unlocks. Should switching back
// fail, the thread stays locked and Go ends it with the goroutine, so
// no other goroutine ever runs in the wrong namespace. The server then
// runs in this process like any other: the registry's handler, its
// recorder and counts need no second process to be read.
func listenIn(ns, addr string) (net.Listener, error) {
	return onThreadIn(ns, func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// onThreadIn runs fn in namespace ns on a goroutine locked to its OS
// thread (inNamespace), and returns what fn made.
func onThreadIn[T io.Closer](ns string, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		v, err := inNamespace(ns, fn)
		done <- result{v, err}
	}()
	r := <-done
	return r.v, r.err
}

// inNamespace runs fn with the calling thread, which must be locked, in
// ns, and unlocks the thread once it is back in its own namespace.
func inNamespace[T io.Closer](ns string, fn func() (T, error)) (T, error) {
	var none T
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return none, err
	}
	defer self.Close()
	target, err := os.Open(netnsDir + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return none, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return none, fmt.Errorf("enter netns %s: %w", ns, err)
	}
	v, err := fn()
	if berr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); berr != nil {
		if err == nil {
			v.Close()
		}
		return none, fmt.Errorf("leave netns %s: %w", ns, berr)
	}
	runtime.UnlockOSThread()
	return v, err
}

// dialIn connects to addr from inside namespace ns, as listenIn listens:
// the socket stays in the namespace it was made in.
func dialIn(ctx context.Context, ns, addr string) (net.Conn, error) {
	return onThreadIn(ns, func() (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
}
