// Package daemon runs the real bin/containerd for integration tests: as
// root, with temporary root, state and socket, a generated config, and
// overlayfs where it mounts (native otherwise). Everything it started or
// mounted is stopped and unmounted when the test ends, pass or fail.
package daemon

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Options shape the generated config.
type Options struct {
	// HostsDir is the registry config_path (hosts.toml tree) for CRI and the
	// transfer service.
	HostsDir string
	// ExtraConfig is TOML appended to the generated config, for sections the
	// harness does not write itself.
	ExtraConfig string
	// CRIImages is TOML for [plugins."io.containerd.cri.v1.images"] beyond
	// what the harness sets (snapshotter, registry config_path).
	CRIImages string
	// Transfer is TOML for [plugins."io.containerd.transfer.v1.local"]
	// beyond what the harness sets (config_path, unpack_config).
	Transfer string
	// Binary is the containerd to run; default bin/containerd. Benchmarks
	// run a stock containerd built from the same module beside it.
	Binary string
	// LogLevel defaults to debug.
	LogLevel string
	// Snapshotter, when set, is the snapshotter CRI and the transfer
	// service unpack into (a proxy snapshotter that ExtraConfig declares,
	// say) instead of overlayfs or native.
	Snapshotter string
	// NoUnpackConfig leaves the transfer service's unpack_config out, as
	// the install docs of remote snapshotters (stargz, SOCI, nydus) do:
	// containerd then has only its default unpack platform.
	NoUnpackConfig bool
	// Root, when set, is containerd's root directory (on a small
	// filesystem, say) instead of one under Dir.
	Root string
}

// Daemon is a running containerd.
type Daemon struct {
	// ReadyTimeout bounds each start; 60s when zero. Benchmarks with large
	// image stores raise it: CRI loads every image before it serves.
	ReadyTimeout time.Duration

	Dir         string // holds root, state, socket, config and log
	Root        string
	State       string
	Socket      string // unix socket path
	Snapshotter string
	MetricsAddr string // host:port of the prometheus endpoint
	DebugSocket string // pprof over HTTP on a unix socket

	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

// Bin returns the path of a binary built by `make build`.
func Bin(name string) string {
	dir := os.Getenv("PULLWISE_BIN")
	if dir == "" {
		dir = "../bin"
	}
	p, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		panic(err)
	}
	return p
}

var configTemplate = template.Must(template.New("config").Parse(`version = 4
root = "{{.Root}}"
state = "{{.State}}"

[plugins."io.containerd.server.v1.grpc"]
  address = "{{.Socket}}"

[plugins."io.containerd.server.v1.ttrpc"]
  address = "{{.Socket}}.ttrpc"

[plugins."io.containerd.server.v1.metrics"]
  address = "{{.MetricsAddr}}"

[plugins."io.containerd.server.v1.debug"]
  address = "{{.DebugSocket}}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "{{.Snapshotter}}"
{{.CRIImages}}
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{{.HostsDir}}"

[plugins."io.containerd.cri.v1.runtime"]
  # root in this sandbox may not lower oom_score_adj below its own.
  restrict_oom_score_adj = true

[plugins."io.containerd.transfer.v1.local"]
  config_path = "{{.HostsDir}}"
{{.Transfer}}
{{if .UnpackConfig}}
  [[plugins."io.containerd.transfer.v1.local".unpack_config]]
    platform = "{{.Platform}}"
    snapshotter = "{{.Snapshotter}}"
    differ = "walking"
{{end}}
{{.ExtraConfig}}
`))

// Start runs containerd and waits until it serves CRI.
func Start(t testing.TB, opts Options) *Daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "pullwise-containerd-")
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{
		Dir:         dir,
		Root:        filepath.Join(dir, "root"),
		State:       filepath.Join(dir, "state"),
		Socket:      filepath.Join(dir, "containerd.sock"),
		Snapshotter: opts.Snapshotter,
		MetricsAddr: FreeAddr(t),
		DebugSocket: filepath.Join(dir, "debug.sock"),
		logPath:     filepath.Join(dir, "containerd.log"),
		exited:      make(chan struct{}),
	}
	if opts.Root != "" {
		d.Root = opts.Root
	}
	if d.Snapshotter == "" {
		d.Snapshotter = snapshotter(t, dir)
	}
	// Cleanups run last-in first-out: stop the daemon, then unmount, then
	// remove the directory.
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Cleanup(func() { UnmountUnder(t, dir) })

	cfgPath := d.writeConfig(t, opts)
	logFile, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	bin, level := opts.Binary, opts.LogLevel
	if bin == "" {
		bin = Bin("containerd")
	}
	if level == "" {
		level = "debug"
	}
	d.cmd = exec.Command(bin, "--config", cfgPath, "--log-level", level)
	d.cmd.Stdout, d.cmd.Stderr = logFile, logFile
	// containerd looks up containerd-shim-runc-v2 in PATH: the one beside
	// the binary, from bin/ or an installed release.
	d.cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	// Own process group, so a test's ^C does not reach the daemon first and
	// the cleanup can still stop it in order.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	go func() { _ = d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() { d.stop(t) })

	if err := d.waitReady(d.readyTimeout()); err != nil {
		t.Fatalf("containerd did not become ready: %v\n%s", err, d.LogTail(60))
	}
	return d
}

// Goroutines returns how many goroutines containerd runs, from its pprof
// endpoint, for tests that prove work ends when it should.
func (d *Daemon) Goroutines(t testing.TB) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscanf(d.GoroutineDump(t), "goroutine profile: total %d", &n); err != nil {
		t.Fatalf("goroutine profile: %v", err)
	}
	return n
}

// GoroutineDump returns containerd's goroutines with their stacks, to
// show what is left when a count does not come back down.
func (d *Daemon) GoroutineDump(t testing.TB) string {
	t.Helper()
	return d.debugRead(t, "/debug/pprof/goroutine?debug=1")
}

// LiveHeap returns the bytes of live heap objects in containerd right
// after a forced GC (pprof's heap profile with gc=1, whose text form ends
// with runtime.MemStats), for tests that prove memory does not grow.
func (d *Daemon) LiveHeap(t testing.TB) int64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(d.debugRead(t, "/debug/pprof/heap?gc=1&debug=1")))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapAlloc = "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("heap profile: HeapAlloc %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("heap profile without HeapAlloc (scan error %v)", sc.Err())
	return 0
}

// ProfileAsked starts what PULLWISE_BENCH_PROFILE, PULLWISE_BENCH_TRACE and
// PULLWISE_BENCH_PERF (each a file prefix) ask of d for the burst that
// starts now: a CPU profile, an execution trace (containerd's pprof
// endpoint), and Linux perf's view (perfAsked),
// PULLWISE_BENCH_PROFILE_SECONDS long (2 by default), written to
// prefix.name. The func it returns waits for them.
//
// The caller must wait before its test ends, however it ends (defer): a
// profile still running would report to a finished test.
func (d *Daemon) ProfileAsked(t testing.TB, name string) (wait func()) {
	t.Helper()
	var profiled sync.WaitGroup
	var seconds int
	for _, kind := range []string{"profile", "trace"} {
		prefix := os.Getenv("PULLWISE_BENCH_" + strings.ToUpper(kind))
		if prefix == "" {
			continue
		}
		if seconds == 0 {
			seconds = profileSeconds(t)
		}
		path := fmt.Sprintf("/debug/pprof/%s?seconds=%d", kind, seconds)
		// t.Error, not Fatal: this is not the test's goroutine.
		profiled.Go(func() {
			b, err := d.debugGet(path)
			if err == nil {
				err = os.WriteFile(prefix+"."+name, b, 0o644)
			}
			if err != nil {
				t.Errorf("%s of containerd: %v", kind, err)
			}
		})
	}
	if prefix := os.Getenv("PULLWISE_BENCH_PERF"); prefix != "" {
		d.perfAsked(t, &profiled, prefix+"."+name, profileSeconds(t))
	}
	return profiled.Wait
}

// perfSyscalls are the system calls perfAsked counts: those an unpack
// makes per file, and those of the daemon's waiting and syncing. Go's
// os.Lstat is newfstatat on Linux.
var perfSyscalls = []string{
	"newfstatat", "openat", "read", "write", "close", "mkdirat",
	"fchmodat", "fchownat", "utimensat", "lsetxattr", "lgetxattr",
	"unlinkat", "renameat2", "linkat", "symlinkat", "mknodat", "getdents64",
	"mount", "umount", "fsync", "syncfs", "futex", "epoll_pwait",
	"nanosleep", "sched_yield",
}

// perfAsked records d with perf for seconds: where the machine's CPUs
// go, the kernel's stacks included, to path.data, with d's PID in
// path.pid (perf report -i path.data --pid PID keeps d's threads), and
// how many of each system call d makes, to path.stat (CSV). A Go profile
// shows every system call as one Syscall6; this says which calls, how
// many, and what they cost inside the kernel, so two daemons' unpacks can
// be compared call for call. The record is of every CPU, not of d's
// process: following the process follows the shims and runc it starts
// too, and lost most samples under kubelet.
func (d *Daemon) perfAsked(t testing.TB, wg *sync.WaitGroup, path string, seconds int) {
	t.Helper()
	events := []string{"task-clock", "context-switches", "cpu-migrations", "page-faults"}
	for _, sc := range perfSyscalls {
		events = append(events, "syscalls:sys_enter_"+sc)
	}
	pid, secs := strconv.Itoa(d.PID()), strconv.Itoa(seconds)
	if err := os.WriteFile(path+".pid", []byte(pid+"\n"), 0o644); err != nil {
		t.Fatalf("perf of containerd: %v", err)
	}
	for _, args := range [][]string{
		{"record", "--quiet", "-a", "-g", "-F", "999", "-e", "cpu-clock", "-o", path + ".data"},
		{"stat", "-x,", "-e", strings.Join(events, ","), "-o", path + ".stat", "-p", pid},
	} {
		cmd := exec.Command("perf", append(args, "--", "sleep", secs)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		// Started here, not in the goroutine, so the burst is recorded
		// from its start.
		if err := cmd.Start(); err != nil {
			t.Fatalf("perf %s of containerd: %v", args[0], err)
		}
		wg.Go(func() {
			if err := cmd.Wait(); err != nil {
				t.Errorf("perf %s of containerd: %v: %s", args[0], err, stderr.Bytes())
			}
		})
	}
}

// CPUTime is the user and system CPU time containerd has used so far.
func (d *Daemon) CPUTime(t testing.TB) time.Duration {
	t.Helper()
	return d.Usage(t).CPU
}

// Usage is what containerd has used so far, read from /proc/PID/stat at
// one instant.
type Usage struct {
	CPU time.Duration // user and system
	// PageFaults are its minor page faults (minflt): mostly pages of
	// memory new to it, touched for the first time, and pages of its
	// mapped files (bbolt's) not yet in its page tables. On a
	// paravirtualized guest each costs far more than using a page it has,
	// so that memory churn shows as CPU.
	PageFaults int64
}

// Usage reads containerd's Usage.
func (d *Daemon) Usage(t testing.TB) Usage {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.PID()))
	if err != nil {
		t.Fatalf("containerd's /proc stat: %v", err)
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces, start at the third of proc(5)'s.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	field := func(n int) int64 {
		v, err := strconv.ParseInt(fields[n-3], 10, 64)
		if err != nil {
			t.Fatalf("containerd's /proc stat field %d: %q: %v", n, fields[n-3], err)
		}
		return v
	}
	// utime and stime are in clock ticks: 100 a second on Linux,
	// whatever the kernel's HZ.
	return Usage{
		CPU:        time.Duration(field(14)+field(15)) * 10 * time.Millisecond,
		PageFaults: field(10),
	}
}

// ResetPeakRSS starts containerd's peak resident memory afresh (Linux's
// clear_refs 5), so that PeakRSS gives the peak of what follows.
func (d *Daemon) ResetPeakRSS(t testing.TB) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", d.PID()), []byte("5"), 0); err != nil {
		t.Fatalf("reset containerd's peak RSS: %v", err)
	}
}

// PeakRSS is containerd's peak resident memory (VmHWM) in bytes, since it
// started or since ResetPeakRSS.
func (d *Daemon) PeakRSS(t testing.TB) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.PID()))
	if err != nil {
		t.Fatalf("containerd peak RSS: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("containerd peak RSS: %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatal("containerd peak RSS: no VmHWM in /proc status")
	return 0
}

// debugRead GETs path on containerd's debug socket and reads the whole
// answer: a handler left writing to a client that stopped reading would
// count among the goroutines of the next look.
func (d *Daemon) debugRead(t testing.TB, path string) string {
	t.Helper()
	b, err := d.debugGet(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// debugGet is debugRead for callers off the test's goroutine.
func (d *Daemon) debugGet(path string) ([]byte, error) {
	// No keep-alive: an idle connection would show up as goroutines.
	c := http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.DebugSocket)
	}}}
	resp, err := c.Get("http://containerd" + path)
	if err != nil {
		return nil, fmt.Errorf("GET %s on the debug socket: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = errors.New(resp.Status)
	}
	if err != nil {
		return nil, fmt.Errorf("GET %s on the debug socket: %w", path, err)
	}
	return b, nil
}

// writeConfig renders the config for opts into Dir/config.toml.
func (d *Daemon) writeConfig(t testing.TB, opts Options) string {
	t.Helper()
	var cfg bytes.Buffer
	unpackConfig := "yes"
	if opts.NoUnpackConfig {
		unpackConfig = ""
	}
	err := configTemplate.Execute(&cfg, map[string]string{
		"Root": d.Root, "State": d.State, "Socket": d.Socket, "MetricsAddr": d.MetricsAddr, "DebugSocket": d.DebugSocket,
		"Snapshotter": d.Snapshotter, "HostsDir": opts.HostsDir, "Platform": hostPlatform(),
		"CRIImages": opts.CRIImages, "ExtraConfig": opts.ExtraConfig, "Transfer": opts.Transfer,
		"UnpackConfig": unpackConfig,
	})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(d.Dir, "config.toml")
	if err := os.WriteFile(p, cfg.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// RestartWith stops containerd, rewrites its config for opts, and starts
// it again on the same root and state.
func (d *Daemon) RestartWith(t testing.TB, opts Options) {
	t.Helper()
	d.writeConfig(t, opts)
	d.Restart(t)
}

// PID is containerd's process ID.
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Endpoint is the socket as a CRI endpoint URL.
func (d *Daemon) Endpoint() string { return "unix://" + d.Socket }

// Log returns everything the daemon logged so far.
func (d *Daemon) Log() string { return LogFile(d.logPath).Text() }

// LogTail returns the last n lines of the daemon's log.
func (d *Daemon) LogTail(n int) string { return LogFile(d.logPath).Tail(n) }

func (d *Daemon) waitReady(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+d.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	rt := criapi.NewRuntimeServiceClient(conn)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		callCtx, callCancel := context.WithTimeout(ctx, time.Second)
		_, err := rt.Version(callCtx, &criapi.VersionRequest{})
		callCancel()
		if err == nil {
			return nil
		}
		select {
		case <-d.exited:
			return fmt.Errorf("containerd exited: %v", d.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM, then SIGKILL if containerd has not exited in time,
// and dumps the log tail when the test failed.
func (d *Daemon) stop(t testing.TB) {
	if t.Failed() {
		t.Logf("containerd log (tail):\n%s", d.LogTail(80))
	}
	if Terminate(d.cmd, d.exited, 20*time.Second) {
		t.Errorf("containerd ignored SIGTERM for 20s; killed it")
	}
}

// Restart stops containerd and starts it again on the same root and state.
func (d *Daemon) Restart(t testing.TB) {
	t.Helper()
	d.stop(t)
	d.Respawn(t)
	d.WaitReady(t)
}

// Stop stops containerd as its service would, with SIGTERM.
func (d *Daemon) Stop(t testing.TB) {
	t.Helper()
	d.stop(t)
}

// Kill ends containerd with SIGKILL, as a crash or the OOM killer would,
// and waits until it is gone. Only containerd itself: shims, as on a node,
// are not its process group's business here.
func (d *Daemon) Kill(t testing.TB) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("kill containerd: %v", err)
	}
	<-d.exited
}

// Running reports whether containerd has not exited.
func (d *Daemon) Running() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// Respawn starts containerd again on the same root, state and config once
// it has exited (after Kill), without waiting for it to serve: a test can
// watch what it does while it starts. WaitReady waits for it.
func (d *Daemon) Respawn(t testing.TB) {
	t.Helper()
	if d.Running() {
		t.Fatal("respawn: containerd is still running")
	}
	logFile, err := os.OpenFile(d.logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(d.cmd.Path, d.cmd.Args[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = d.cmd.SysProcAttr
	cmd.Env = d.cmd.Env
	if err := cmd.Start(); err != nil {
		t.Fatalf("restart containerd: %v", err)
	}
	d.cmd, d.exited = cmd, make(chan struct{})
	exited := d.exited
	go func() { _ = cmd.Wait(); close(exited) }()
}

// WaitReady waits until containerd serves CRI.
func (d *Daemon) WaitReady(t testing.TB) {
	t.Helper()
	if err := d.waitReady(d.readyTimeout()); err != nil {
		t.Fatalf("containerd did not become ready after restart: %v\n%s", err, d.LogTail(60))
	}
}

// FreeAddr returns a loopback host:port that nothing listens on (now).
//
// The port is drawn below the kernel's ephemeral range: a port the kernel
// handed out for ":0" goes back to that range when closed, and a listener
// of containerd's own on ":0" (the progress server) could take it between
// now and a restart, which then fails with "address already in use".
func FreeAddr(t testing.TB) string {
	const lo, hi = 20000, 32000 // below net.ipv4.ip_local_port_range's default 32768
	for range 100 {
		addr := fmt.Sprintf("127.0.0.1:%d", lo+rand.IntN(hi-lo))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	t.Fatal("no free loopback port below the ephemeral range")
	return ""
}

// snapshotter picks overlayfs when an overlay mounts in dir's filesystem,
// since the test root lives there, and native otherwise.
func snapshotter(t testing.TB, dir string) string {
	name, err := ProbeSnapshotter(dir)
	if err != nil {
		t.Fatal(err)
	}
	if name != "overlayfs" {
		t.Logf("overlay does not mount in %s: using the %s snapshotter", dir, name)
	}
	return name
}

// ProbeSnapshotter returns "overlayfs" when an overlay mounts in dir's
// filesystem and "native" otherwise.
func ProbeSnapshotter(dir string) (string, error) {
	probe := filepath.Join(dir, "overlay-probe")
	lower, upper, work, merged := filepath.Join(probe, "l"), filepath.Join(probe, "u"), filepath.Join(probe, "w"), filepath.Join(probe, "m")
	for _, p := range []string{lower, upper, work, merged} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return "", fmt.Errorf("probe overlay: %w", err)
		}
	}
	defer os.RemoveAll(probe)
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return "native", nil
	}
	_ = unix.Unmount(merged, 0)
	return "overlayfs", nil
}

// UnmountUnder unmounts every mount at or below dir, deepest first, and
// fails t for each that stays.
func UnmountUnder(t testing.TB, dir string) {
	if err := Unmount(dir); err != nil {
		t.Error(err)
	}
}

// Unmount unmounts every mount at or below dir, deepest first.
// containerd leaves snapshot and shm mounts behind when it is killed;
// kubelet bind-mounts its root dir onto itself. A mount already gone
// (EINVAL) is no error.
func Unmount(dir string) error {
	points, err := MountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := unix.Unmount(points[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}

// MountsUnder lists the mount points at or below dir, parents first.
func MountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	return points, nil
}

func (d *Daemon) readyTimeout() time.Duration {
	if d.ReadyTimeout > 0 {
		return d.ReadyTimeout
	}
	return 60 * time.Second
}
