package integration

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
	"github.com/pullwise/pullwise/internal/await"
)

// Mirror modes: a pull-through cache of upstream, or a second registry
// seeded with the same images.
const (
	mirrorProxy  = "proxy"
	mirrorSeeded = "seeded"
)

type envOptions struct {
	mirror      string // "", mirrorProxy or mirrorSeeded
	criImages   string // extra TOML for the CRI images plugin
	extraConfig string
	transfer    string // TOML for the transfer plugin's own table
	// noKeepAlive makes the registries close connections after each
	// response, and those that send no request within 2s, for tests that
	// count containerd's goroutines.
	noKeepAlive bool
	// logLevel is containerd's; debug when empty. Benchmarks use info, as
	// a node would.
	logLevel string
	// redirectBlobs makes upstream send blob GETs to its CDN.
	redirectBlobs bool
	// binary is the containerd to run, such as one installed from the
	// release tarball; bin/containerd when empty.
	binary string
}

// daemonOptions is the daemon config for opts, with hostsDir as the
// registry config_path.
func (opts envOptions) daemonOptions(hostsDir string) daemon.Options {
	return daemon.Options{HostsDir: hostsDir, CRIImages: opts.criImages, ExtraConfig: opts.extraConfig,
		Transfer: opts.transfer, LogLevel: opts.logLevel, Binary: opts.binary}
}

// env is one containerd with an upstream registry and, optionally, a mirror
// for it configured through hosts.toml.
type env struct {
	t        testing.TB
	d        *daemon.Daemon
	upstream *registry.Registry
	mirror   *registry.Registry
	mode     string // mirror mode
	hostsDir string
	runtime  internalapi.RuntimeService
	images   internalapi.ImageManagerService
	pullwise api.PullwiseClient
	// conn reaches containerd's own gRPC API, beside CRI; gRPC reconnects
	// it across restarts.
	conn *grpc.ClientConn
}

func newEnv(t testing.TB, opts envOptions) *env {
	t.Helper()
	e := &env{t: t, hostsDir: t.TempDir(), mode: opts.mirror}
	ro := func(name, proxy string) registry.Options {
		o := registry.Options{Name: name, ProxyRemoteURL: proxy, DisableKeepAlives: opts.noKeepAlive}
		if opts.noKeepAlive {
			o.HeaderTimeout = 2 * time.Second
		}
		return o
	}
	up := ro("upstream", "")
	up.RedirectBlobs = opts.redirectBlobs
	e.upstream = registry.Start(t, up)
	switch opts.mirror {
	case mirrorProxy:
		e.mirror = registry.Start(t, ro("mirror", e.upstream.URL()))
	case mirrorSeeded:
		e.mirror = registry.Start(t, ro("mirror", ""))
	}
	e.writeHosts()
	e.d = daemon.Start(t, opts.daemonOptions(e.hostsDir))
	e.connect()
	return e
}

// sibling starts another containerd on the same registries and hosts.toml,
// such as a stock containerd to compare against.
func (e *env) sibling(opts daemon.Options) *env {
	e.t.Helper()
	s := *e
	opts.HostsDir = e.hostsDir
	s.d = daemon.Start(e.t, opts)
	s.connect()
	return &s
}

// writeHosts configures upstream as plain HTTP, behind the mirror if any.
func (e *env) writeHosts() {
	mirror := ""
	if e.mirror != nil {
		mirror = e.mirror.URL()
	}
	e.writeHostsFor(e.upstream.Host(), e.upstream.URL(), mirror, "pull", "resolve")
}

// writeHostsFor writes the hosts.toml of registry host: server, behind
// mirror (a URL, none when empty) with caps. containerd reads hosts.toml on
// every pull, so no restart is needed.
func (e *env) writeHostsFor(host, server, mirror string, caps ...string) {
	e.t.Helper()
	if err := registry.WriteHosts(e.hostsDir, host, server, mirror, caps...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) connect() {
	ctx := context.Background()
	var err error
	// Streaming list RPCs on, as kubelet can run them, so they get exercised.
	e.runtime, err = remote.NewRemoteRuntimeService(ctx, e.d.Endpoint(), 10*time.Second, nil, true)
	if err != nil {
		e.t.Fatal(err)
	}
	e.images, err = remote.NewRemoteImageService(ctx, e.d.Endpoint(), 10*time.Second, nil, true)
	if err != nil {
		e.t.Fatal(err)
	}
	conn, err := grpc.NewClient(e.d.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	e.conn = conn
	e.pullwise = api.NewPullwiseClient(conn)
}

// inNamespace is a context for containerd's own API in namespace ns.
func inNamespace(ns string) context.Context {
	return namespaces.WithNamespace(context.Background(), ns)
}

// push seeds an image on upstream, and on a seeded mirror too.
func (e *env) push(repo, tag string, img registry.Image) registry.Pushed {
	e.t.Helper()
	p := e.upstream.Push(e.t, repo, tag, img)
	if e.mode == mirrorSeeded {
		e.mirror.Push(e.t, repo, tag, img)
	}
	e.upstream.Reset()
	if e.mirror != nil {
		e.mirror.Reset()
	}
	return p
}

// run runs a binary from bin/ and returns its combined output.
func run(t testing.TB, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, daemon.Bin(name), args...).CombinedOutput()
	return string(out), err
}

// ctr runs ctr against the env's containerd in namespace ns.
func (e *env) ctr(ns string, args ...string) (string, error) {
	return run(e.t, "ctr", append([]string{"-a", e.d.Socket, "-n", ns}, args...)...)
}

// pullctl runs pullctl against the env's containerd.
func (e *env) pullctl(args ...string) (string, error) {
	return run(e.t, "pullctl", append([]string{"-r", e.d.Endpoint()}, args...)...)
}

// metric returns the value of the sample whose name and labels (in
// Prometheus text form, e.g. `x_total{a="b"}`) match exactly, or 0.
func (e *env) metric(sample string) float64 {
	e.t.Helper()
	v, _ := e.d.Metric(e.t, sample)
	return v
}

// eventually polls cond until it holds, failing the test naming what once
// timeout has passed: await.Until, the unit tests' wait too.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	await.Until(t, timeout, what, cond)
}

// awaitGoroutines waits until containerd runs no more goroutines than
// baseline, and fails with their stacks if it does not within timeout.
func (e *env) awaitGoroutines(baseline int, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for e.d.Goroutines(e.t) > baseline {
		if time.Now().After(deadline) {
			e.t.Fatalf("goroutines not back to %d after %s:\n%s", baseline, timeout, e.d.GoroutineDump(e.t))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restartWith restarts containerd with a config for opts, keeping its root,
// state and registries; clients reconnect by themselves.
func (e *env) restartWith(t testing.TB, opts envOptions) {
	t.Helper()
	e.d.RestartWith(t, opts.daemonOptions(e.hostsDir))
}

// code is the gRPC code name of err.
func code(err error) string { return status.Code(err).String() }

// logLine is the first line of containerd's log that holds every one of
// parts, or "".
func logLine(log string, parts ...string) string {
	for line := range strings.Lines(log) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return strings.TrimSuffix(line, "\n")
		}
	}
	return ""
}
