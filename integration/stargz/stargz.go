// Package stargz runs a real lazy-pulling remote snapshotter for the
// integration tests: stargz-snapshotter as bin/containerd-stargz-grpc
// (`make stargz`, built from hack/stargz), a containerd proxy plugin on a
// unix socket. It mounts each eStargz layer as a FUSE filesystem and
// fetches the TOC and chunks itself, so it needs root and FUSE (see FUSE).
//
// A test starts it before containerd, so that its cleanup, last in first
// out, runs after containerd's:
//
//	sn := stargz.Start(t, t.TempDir())
//	d := daemon.Start(t, daemon.Options{
//		Snapshotter:    "stargz",
//		NoUnpackConfig: true,
//		CRIImages:      stargz.CRIImages,
//		ExtraConfig:    sn.ProxyPlugin(),
//		...
//	})
package stargz

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/snapshots/proxy"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/pullwise/pullwise/integration/daemon"
)

const (
	// Name is the proxy plugin's name in ProxyPlugin, the snapshotter to
	// give daemon.Options.Snapshotter.
	Name = "stargz"
	// RemoteLabel marks the snapshotter's committed snapshots that it
	// mounted from the registry instead of having containerd unpack them.
	RemoteLabel = "containerd.io/snapshot/remote"
	// CRIImages is the daemon.Options.CRIImages a lazy pull needs: CRI
	// passes the image ref and layer digests to the snapshotter as
	// snapshot labels only with snapshot annotations enabled.
	CRIImages = "  disable_snapshot_annotations = false\n"
)

// readyTimeout bounds the wait for the socket; stopTimeout the wait for
// the snapshotter to unmount and exit on SIGTERM.
const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 20 * time.Second
)

// Snapshotter is a running containerd-stargz-grpc.
type Snapshotter struct {
	Socket string // unix socket serving the snapshots API
	Root   string // the snapshotter's state and mount points

	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

// Start runs bin/containerd-stargz-grpc with its root and log under dir
// and waits until its socket answers. plainHTTP lists registry hosts
// (host:port) it should reach over plain HTTP; loopback hosts such as the
// test registries' 127.0.0.1:port are plain HTTP to it anyway. When the
// test ends it is stopped with SIGTERM, which unmounts its FUSE layers,
// and whatever is still mounted under its root is unmounted.
func Start(t testing.TB, dir string, plainHTTP ...string) *Snapshotter {
	t.Helper()
	s := &Snapshotter{
		Root:    filepath.Join(dir, "stargz-root"),
		Socket:  filepath.Join(dir, "stargz.sock"),
		logPath: filepath.Join(dir, "stargz.log"),
		exited:  make(chan struct{}),
	}
	// A unix socket path is limited to 107 bytes; t.TempDir's may be longer.
	if len(s.Socket) > 100 {
		short, err := os.MkdirTemp("", "pw-stargz-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(short) })
		s.Socket = filepath.Join(short, "stargz.sock")
	}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	args := []string{"-root", s.Root, "-address", s.Socket, "-log-level", "debug"}
	if len(plainHTTP) > 0 {
		args = append(args, "-plain-http", strings.Join(plainHTTP, ","))
	}
	s.cmd = exec.Command(daemon.Bin("containerd-stargz-grpc"), args...)
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start containerd-stargz-grpc (make stargz): %v", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	// Last in first out: stop it, then unmount what it left.
	t.Cleanup(func() { daemon.UnmountUnder(t, s.Root) })
	t.Cleanup(func() { s.stop(t) })

	if err := s.waitReady(readyTimeout); err != nil {
		t.Fatalf("containerd-stargz-grpc did not become ready: %v\n%s", err, s.LogTail(40))
	}
	return s
}

// ProxyPlugin is the containerd config declaring this snapshotter as proxy
// plugin Name, for daemon.Options.ExtraConfig.
func (s *Snapshotter) ProxyPlugin() string {
	return fmt.Sprintf("[proxy_plugins.%s]\n  type = \"snapshot\"\n  address = %q\n", Name, s.Socket)
}

// waitReady polls a dial of the socket until it answers, the process
// exits or timeout passes.
func (s *Snapshotter) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		conn, err := net.DialTimeout("unix", s.Socket, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer on %s after %v (last error: %v)", s.Socket, timeout, err)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("containerd-stargz-grpc exited: %v", s.cmd.ProcessState)
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM, then SIGKILL if the snapshotter has not exited in
// time, and dumps the log tail when the test failed.
func (s *Snapshotter) stop(t testing.TB) {
	if t.Failed() {
		t.Logf("containerd-stargz-grpc log (tail):\n%s", s.LogTail(60))
	}
	if daemon.Terminate(s.cmd, s.exited, stopTimeout) {
		t.Errorf("containerd-stargz-grpc ignored SIGTERM for %v; killed it", stopTimeout)
	}
	// Close unmounts every layer; what a killed snapshotter leaves is
	// unmounted by the next cleanup, said here so it does not go unseen.
	if left, err := daemon.MountsUnder(s.Root); err == nil && len(left) > 0 {
		t.Logf("containerd-stargz-grpc left %d mounts under %s", len(left), s.Root)
	}
}

// Log returns everything the snapshotter logged so far.
func (s *Snapshotter) Log() string { return daemon.LogFile(s.logPath).Text() }

// LogTail returns the last n lines of the snapshotter's log.
func (s *Snapshotter) LogTail(n int) string { return daemon.LogFile(s.logPath).Tail(n) }

// Snapshots lists the snapshots as the snapshotter itself keeps them,
// asked on its own socket: containerd's view of them (its metadata store)
// does not carry the snapshotter's labels, such as RemoteLabel.
func (s *Snapshotter) Snapshots(t testing.TB) []snapshots.Info {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+s.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sn := proxy.NewSnapshotter(snapshotsapi.NewSnapshotsClient(conn), Name)
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), "default"), 30*time.Second)
	defer cancel()
	var infos []snapshots.Info
	if err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		infos = append(infos, info)
		return nil
	}); err != nil {
		t.Fatalf("walk stargz snapshots: %v", err)
	}
	return infos
}

// IsRemote reports whether the snapshotter mounted info's layer from the
// registry (lazily) rather than containerd unpacking it.
func IsRemote(info snapshots.Info) bool {
	_, ok := info.Labels[RemoteLabel]
	return ok
}

// FUSE returns why FUSE cannot be used here, nil when it can: no
// /dev/fuse, or the kernel refuses a FUSE mount (no fuse module, or a
// container without the privilege). It mounts and unmounts a FUSE
// filesystem as stargz does (a direct mount(2), no fusermount), so it
// needs root, like the snapshotter.
func FUSE() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("FUSE unavailable: %w", err)
	}
	defer f.Close()
	dir, err := os.MkdirTemp("", "pw-fuse-probe-")
	if err != nil {
		return fmt.Errorf("FUSE probe: %w", err)
	}
	defer os.Remove(dir)
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=%d,group_id=%d", f.Fd(), os.Getuid(), os.Getgid())
	if err := unix.Mount("pullwise-probe", dir, "fuse.pullwise-probe", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("FUSE unavailable: mount of a fuse filesystem on %s: %w", dir, err)
	}
	// Nobody serves the mount: detach it, then closing /dev/fuse aborts
	// the connection.
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("FUSE probe: unmount %s: %w", dir, err)
	}
	return nil
}
