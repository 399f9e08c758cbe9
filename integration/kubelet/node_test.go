package kubelet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// Pod-level deadlines. A static pod whose image is local runs about a
// second after its manifest appears; kubelet's image pull back-off starts
// at 10 s and doubles.
const (
	podTimeout   = 30 * time.Second
	retryTimeout = 90 * time.Second
)

// nodeOptions shape one node: a containerd, its registries and a kubelet.
type nodeOptions struct {
	// pullwise is TOML for the Pullwise plugin section, e.g. a pull limit.
	pullwise string
	// binary is the containerd to run; default bin/containerd.
	binary string
	// wan serves the registries' pulls through this profile.
	wan *registry.WAN
	// prePull lists images ("repo:tag") pushed to upstream and pulled
	// through CRI before kubelet starts; prePullPause pulls the sandbox
	// image too.
	prePull      []string
	prePullPause bool
	// noMirror pulls straight from upstream, with no pull-through mirror.
	noMirror bool
	// upstream, when set, is reused instead of starting a registry, so
	// nodes can share seeded images (benchmarks).
	upstream *registry.Registry
	// criImages is TOML for CRI's image plugin, such as a platform's
	// discard_unpacked_layers.
	criImages string
	// transfer is TOML for the transfer plugin's table.
	transfer string
	kubelet  Options
}

// node is a Pullwise containerd configured with an upstream registry,
// behind a pull-through mirror unless noMirror (hosts.toml), a sandbox
// image from that registry, and a standalone kubelet on top.
type node struct {
	// t is the test the helpers report to; subtests sharing a node set it
	// to themselves.
	t        testing.TB
	d        *daemon.Daemon
	upstream *registry.Registry
	mirror   *registry.Registry
	// upHost is the address pulls use for upstream: its own, or its WAN
	// front. The mirror, on the node's side of the link, is never behind
	// the WAN; its misses cross it to upstream.
	upHost   string
	hostsDir string
	pause    registry.Pushed
	rt       criapi.RuntimeServiceClient
	img      criapi.ImageServiceClient
	pw       api.PullwiseClient
	k        *Kubelet
	// prePulled maps nodeOptions.prePull entries to their references.
	prePulled map[string]string
}

func newNode(t testing.TB, opts nodeOptions) *node {
	t.Helper()
	n := &node{t: t, hostsDir: t.TempDir(), upstream: opts.upstream}
	if n.upstream == nil {
		n.upstream = registry.Start(t, registry.Options{Name: "upstream"})
	}
	n.upHost = n.upstream.Host()
	if opts.wan != nil {
		n.upHost = n.upstream.ServeWAN(t, *opts.wan)
	}
	if !opts.noMirror {
		n.mirror = registry.Start(t, registry.Options{Name: "mirror", ProxyRemoteURL: "http://" + n.upHost})
	}
	n.writeHosts()
	// The sandbox image name holds the registry's port, so it is pushed
	// before containerd is configured with it.
	n.pause = n.push("kube/pause", "3.10", runnableImage(t, 1))

	n.d = daemon.Start(t, daemon.Options{
		HostsDir:    n.hostsDir,
		Binary:      opts.binary,
		CRIImages:   opts.criImages + fmt.Sprintf("  [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n    sandbox = %q\n", n.pause.Ref),
		ExtraConfig: opts.pullwise,
		Transfer:    opts.transfer,
		LogLevel:    daemon.LogLevel(),
	})
	if dir := os.Getenv("PULLWISE_KUBELET_LOGS"); dir != "" {
		// Kept beside kubelet's, for debugging: the harness removes
		// containerd's directory. Registered before kubelet starts, so
		// it runs after kubelet stops; containerd's own stop, registered
		// before it, comes after, and its lines are not kept.
		t.Cleanup(func() {
			name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + ".containerd.log"
			if err := os.WriteFile(filepath.Join(dir, name), []byte(n.d.Log()), 0o644); err != nil {
				t.Logf("keep containerd log: %v", err)
			}
		})
	}
	conn, err := grpc.NewClient(n.d.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	n.rt, n.img, n.pw = criapi.NewRuntimeServiceClient(conn), criapi.NewImageServiceClient(conn), api.NewPullwiseClient(conn)
	if opts.prePullPause {
		n.criPull(n.pause.Ref)
	}
	n.prePulled = map[string]string{}
	for i, name := range opts.prePull {
		repo, tag, _ := strings.Cut(name, ":")
		p := n.push(repo, tag, runnableImage(t, int64(1000+i)))
		n.criPull(p.Ref)
		n.prePulled[name] = p.Ref
	}
	kopts := opts.kubelet
	kopts.Endpoint = n.d.Endpoint()
	n.k = Start(t, kopts)
	return n
}

// writeHosts configures upstream as plain HTTP behind the mirror.
func (n *node) writeHosts() {
	dir := filepath.Join(n.hostsDir, n.upHost)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	hosts := fmt.Sprintf("server = %q\n", "http://"+n.upHost)
	if n.mirror != nil {
		hosts += fmt.Sprintf("\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", n.mirror.URL())
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// push seeds an image on upstream and returns it with the reference pods
// use (through the WAN front when there is one). Seeding traffic is
// forgotten by both registries.
func (n *node) push(repo, tag string, img registry.Image) registry.Pushed {
	n.t.Helper()
	p := n.upstream.Push(n.t, repo, tag, img)
	p.Ref = n.upHost + "/" + repo + ":" + tag
	n.upstream.Reset()
	if n.mirror != nil {
		n.mirror.Reset()
	}
	return p
}

// criPull pulls ref through CRI, as kubelet would without a pod.
func (n *node) criPull(ref string) string {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	resp, err := n.img.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
	if err != nil {
		n.t.Fatalf("PullImage %s: %v", ref, err)
	}
	return resp.GetImageRef()
}

// imageStatus is CRI's verbose ImageStatus of ref; nil Image when absent.
func (n *node) imageStatus(ref string) *criapi.ImageStatusResponse {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	resp, err := n.img.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: &criapi.ImageSpec{Image: ref}, Verbose: true})
	if err != nil {
		n.t.Fatalf("ImageStatus %s: %v", ref, err)
	}
	return resp
}

// containerStatus is CRI's verbose ContainerStatus.
func (n *node) containerStatus(id string) *criapi.ContainerStatusResponse {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	resp, err := n.rt.ContainerStatus(ctx, &criapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		n.t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return resp
}

// sandboxOf returns the CRI sandbox kubelet made for the static pod from
// manifest name, if any is ready.
func (n *node) sandboxOf(name string) (string, bool) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	resp, err := n.rt.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{Filter: &criapi.PodSandboxFilter{
		State:         &criapi.PodSandboxStateValue{State: criapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{"io.kubernetes.pod.name": PodName(name)},
	}})
	if err != nil {
		n.t.Fatalf("ListPodSandbox: %v", err)
	}
	if len(resp.GetItems()) == 0 {
		return "", false
	}
	return resp.GetItems()[0].GetId(), true
}

// stopContainer stops a container behind kubelet's back, as a crash
// would; kubelet then restarts it.
func (n *node) stopContainer(id string) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	if _, err := n.rt.StopContainer(ctx, &criapi.StopContainerRequest{ContainerId: id, Timeout: 5}); err != nil {
		n.t.Fatalf("StopContainer %s: %v", id, err)
	}
}

// pullctl runs bin/pullctl against the node's containerd.
func (n *node) pullctl(args ...string) (string, error) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, daemon.Bin("pullctl"), append([]string{"-r", n.d.Endpoint()}, args...)...).CombinedOutput()
	return string(out), err
}

// down makes both registries answer 503 to everything, as an outage
// looks to a client that still reaches the host; nil restores them.
func (n *node) down(isDown bool) {
	var f registry.FaultFunc
	if isDown {
		f = func(registry.Request) *registry.Fault { return &registry.Fault{Status: 503} }
	}
	n.upstream.SetFault(f)
	if n.mirror != nil {
		n.mirror.SetFault(f)
	}
}

// served reports whether r answered a request of kind for repo with
// status.
func served(r *registry.Registry, repo string, kind registry.Kind, method string, status int) int {
	_ = r.WaitIdle(context.Background())
	return r.Count(func(req registry.Request) bool {
		return req.Repo == repo && req.Kind == kind && req.Method == method && req.Status == status
	})
}

// runnableImage is a small image whose entrypoint is /pause; seed varies
// its digest, layers adds data layers before the /pause layer.
func runnableImage(t testing.TB, seed int64, layers ...int64) registry.Image {
	if len(layers) == 0 {
		layers = []int64{4 << 10}
	}
	return registry.Image{
		Layers:     layers,
		Seed:       seed,
		Files:      map[string][]byte{"/pause": daemon.PauseBinary(t)},
		Entrypoint: []string{"/pause"},
	}
}

// repoOf is the repository part of "host/repo:tag".
func repoOf(ref string) string {
	_, rest, _ := strings.Cut(ref, "/")
	repo, _, _ := strings.Cut(rest, ":")
	return repo
}

// listPulls is Pullwise's ListPulls: pulls in flight or queued.
func (n *node) listPulls() []*api.Pull {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	resp, err := n.pw.ListPulls(ctx, &api.ListPullsRequest{})
	if err != nil {
		n.t.Fatalf("ListPulls: %v", err)
	}
	return resp.GetPulls()
}
