// Package kubelet runs the real kubelet (bin/kubelet, built by `make
// kubelet`) in standalone mode against a containerd for end-to-end tests:
// no API server, static pods from a manifest directory, host-network pods
// only (there is no CNI), and every listener on loopback. Pod state is read
// from kubelet's read-only /pods endpoint.
//
// Kubelet changes the host: it sets kernel sysctls, writes to
// /var/lib/kubelet/device-plugins and /var/log/containers, and bind-mounts
// its root dir onto itself. Start records the host first, and the cleanup
// stops kubelet, removes the pods it left, unmounts, and restores the host,
// also when the test fails.
package kubelet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/daemon"
)

// Version is the kubelet `make kubelet` builds; tests check the binary is
// that one, so a stale bin/kubelet is noticed.
const Version = "v1.37.2"

// NodeName is the kubelet's node name; static pods are named
// "<manifest name>-<NodeName>".
const NodeName = "pullwise-e2e"

// Options shape the kubelet configuration.
type Options struct {
	// Endpoint is the CRI endpoint, "unix:///path/containerd.sock".
	Endpoint string
	// MaxParallelImagePulls is kubelet's own limit on parallel pulls
	// (serializeImagePulls is always false); 0 leaves it unset, unlimited.
	MaxParallelImagePulls int
	// Config holds more KubeletConfiguration fields (JSON names), which
	// override the harness's.
	Config map[string]any
	// Verbosity is kubelet's -v; default 2, enough to see pulls and
	// pod lifecycle in the log.
	Verbosity int
}

// Kubelet is a running standalone kubelet.
type Kubelet struct {
	Dir         string // root of everything below
	RootDir     string // --root-dir
	ManifestDir string // staticPodPath
	PodLogsDir  string
	NodeIP      string
	// ReadOnlyAddr serves /pods without authentication, on loopback.
	ReadOnlyAddr string

	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
}

// Bin is bin/kubelet (PULLWISE_BIN, as for the daemon's binaries).
func Bin() string { return daemon.Bin("kubelet") }

// CheckBinary reports whether bin/kubelet exists and is Version.
func CheckBinary() error {
	out, err := exec.Command(Bin(), "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %w: %s (run 'make kubelet')", Bin(), err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "Kubernetes "+Version {
		return fmt.Errorf("%s is %q, want Kubernetes %s (run 'make kubelet')", Bin(), got, Version)
	}
	return nil
}

// NodeIP returns an IPv4 address of this machine that is not loopback.
// kubelet needs one (--node-ip): without it, it looks its own name up in
// DNS, which would leave the machine. Only the address is used; nothing
// is sent to it but from this host.
func NodeIP() (string, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list interfaces: %w", err)
	}
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				return ipn.IP.String(), nil
			}
		}
	}
	return "", errors.New("no non-loopback IPv4 address for --node-ip")
}

// config is the KubeletConfiguration that runs here: cgroup v1 with
// cgroupfs, no swap check, no iptables, no node allocatable enforcement,
// parallel pulls, and every server on loopback with anonymous, always-allow
// auth so /pods can be read.
func (k *Kubelet) config(opts Options, port, healthzPort, readOnlyPort int) map[string]any {
	cfg := map[string]any{
		"kind":                     "KubeletConfiguration",
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"containerRuntimeEndpoint": opts.Endpoint,
		"staticPodPath":            k.ManifestDir,
		"podLogsDir":               k.PodLogsDir,
		"address":                  "127.0.0.1",
		"port":                     port,
		"readOnlyPort":             readOnlyPort,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              healthzPort,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": true},
			"webhook":   map[string]any{"enabled": false},
		},
		"authorization":          map[string]any{"mode": "AlwaysAllow"},
		"cgroupDriver":           "cgroupfs",
		"failSwapOn":             false,
		"failCgroupV1":           false,
		"enforceNodeAllocatable": []string{},
		"makeIPTablesUtilChains": false,
		"serializeImagePulls":    false,
		// The manifest directory is watched with inotify; the periodic
		// re-read is only a fallback.
		"fileCheckFrequency": "5s",
		// Containers that exit restart within a second rather than after
		// the 10 s default back-off (KubeletCrashLoopBackOffMax, beta and
		// on in 1.37).
		"crashLoopBackOff": map[string]any{"maxContainerRestartPeriod": "1s"},
		// Image GC only when a test asks for it.
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
	}
	if opts.MaxParallelImagePulls > 0 {
		cfg["maxParallelImagePulls"] = opts.MaxParallelImagePulls
	}
	maps.Copy(cfg, opts.Config)
	return cfg
}

// Start runs kubelet and waits until it is healthy. bin/kubelet must be
// Version; a missing or other binary fails the test.
func Start(t testing.TB, opts Options) *Kubelet {
	t.Helper()
	if err := CheckBinary(); err != nil {
		t.Fatal(err)
	}
	nodeIP, err := NodeIP()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "pullwise-kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	k := &Kubelet{
		Dir:         dir,
		RootDir:     filepath.Join(dir, "root"),
		ManifestDir: filepath.Join(dir, "manifests"),
		PodLogsDir:  filepath.Join(dir, "pods-logs"),
		NodeIP:      nodeIP,
		logPath:     filepath.Join(dir, "kubelet.log"),
		exited:      make(chan struct{}),
	}
	for _, d := range []string{k.RootDir, k.ManifestDir, k.PodLogsDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	host, err := saveHost()
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-in first-out: stop kubelet, then remove pods,
	// unmount, restore the host, remove the directory.
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Cleanup(func() { host.restore(t) })
	t.Cleanup(func() { daemon.UnmountUnder(t, dir) })
	t.Cleanup(func() { removeAllPods(t, opts.Endpoint) })

	port, healthz, readOnly := freePort(t), freePort(t), freePort(t)
	k.ReadOnlyAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(readOnly))
	cfg, err := json.MarshalIndent(k.config(opts, port, healthz, readOnly), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(k.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	v := opts.Verbosity
	if v == 0 {
		v = 2
	}
	k.cmd = exec.Command(Bin(),
		"--config", cfgPath,
		"--root-dir", k.RootDir,
		"--cert-dir", filepath.Join(dir, "pki"),
		"--volume-plugin-dir", filepath.Join(dir, "volume-plugins"),
		"--node-ip", nodeIP,
		"--hostname-override", NodeName,
		"-v", strconv.Itoa(v),
	)
	k.cmd.Stdout, k.cmd.Stderr = logFile, logFile
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := k.cmd.Start(); err != nil {
		t.Fatalf("start kubelet: %v", err)
	}
	go func() { _ = k.cmd.Wait(); close(k.exited) }()
	t.Cleanup(func() { k.stop(t) })

	if err := k.waitHealthy(net.JoinHostPort("127.0.0.1", strconv.Itoa(healthz)), time.Minute); err != nil {
		t.Fatalf("kubelet did not become healthy: %v\n%s", err, k.LogTail(60))
	}
	return k
}

func freePort(t testing.TB) int {
	_, p, err := net.SplitHostPort(daemon.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

func (k *Kubelet) waitHealthy(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := http.Client{Timeout: time.Second}
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-k.exited:
			return fmt.Errorf("kubelet exited: %v", k.cmd.ProcessState)
		default:
		}
		resp, err := c.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				// /pods is served by another listener, started a moment
				// apart: wait for it too.
				if _, err = k.Pods(); err == nil {
					return nil
				}
			} else {
				err = fmt.Errorf("healthz: %s", resp.Status)
			}
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("not healthy after %s: %v", timeout, last)
}

// stop ends kubelet: SIGTERM, then SIGKILL. kubelet does not stop pods
// when it exits; the next cleanup does. The log tail is printed when the
// test failed.
func (k *Kubelet) stop(t testing.TB) {
	if t.Failed() {
		t.Logf("kubelet log (tail):\n%s", k.LogTail(60))
	}
	if dir := os.Getenv("PULLWISE_KUBELET_LOGS"); dir != "" {
		// Kept for debugging: the harness removes its directory.
		name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + ".log"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(k.Log()), 0o644); err != nil {
			t.Logf("keep kubelet log: %v", err)
		}
	}
	daemon.Terminate(k.cmd, k.exited, 10*time.Second)
}

// Log returns what kubelet logged so far.
func (k *Kubelet) Log() string { return daemon.LogFile(k.logPath).Text() }

// LogTail returns the last n lines of kubelet's log.
func (k *Kubelet) LogTail(n int) string { return daemon.LogFile(k.logPath).Tail(n) }

// LogLines returns the lines of kubelet's log that contain all of words.
func (k *Kubelet) LogLines(words ...string) []string {
	var out []string
	for _, l := range strings.Split(k.Log(), "\n") {
		match := true
		for _, w := range words {
			if !strings.Contains(l, w) {
				match = false
				break
			}
		}
		if match {
			out = append(out, l)
		}
	}
	return out
}

// context for one short call to kubelet or CRI.
func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}
