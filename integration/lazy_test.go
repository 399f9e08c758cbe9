package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/opencontainers/go-digest"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
	"github.com/pullwise/pullwise/integration/stargz"
)

// lazyConfig is one way a node is set up to lazy-pull, as the install
// docs of stargz, SOCI and nydus write it for containerd 2.x.
type lazyConfig struct {
	name string
	// handler pulls with a runtime handler whose snapshotter
	// (runtime_platforms) is stargz; CRI's own stays the default.
	handler bool
	// unpackConfig lists stargz in the transfer service's unpack_config.
	unpackConfig bool
	// annotations turns CRI's snapshot annotations on, which sends stock
	// CRI down its local path.
	annotations bool
	// export has the proxy plugin export enable_remote_snapshot_annotations,
	// for containerd's unpacker to annotate layers itself.
	export bool
	// stock serves the config lazily too, and is checked beside Pullwise.
	stock bool
}

var lazyConfigs = []lazyConfig{
	{name: "CRI snapshotter, install docs", annotations: true, stock: true},
	{name: "CRI snapshotter with unpack_config", annotations: true, unpackConfig: true, stock: true},
	{name: "runtime handler", handler: true, annotations: true, stock: true},
	{name: "export and annotations", annotations: true, export: true, stock: true},
	// CRI then pulls on its transfer path, where stock has no unpack
	// platform for stargz and fails; Pullwise has one.
	{name: "export only", export: true},
}

// lazyNode is a containerd whose pulls can go through a real stargz
// snapshotter, started before it so that it stops after it.
type lazyNode struct {
	*env
	sn *stargz.Snapshotter
}

func newLazyNode(t *testing.T, base *env, c lazyConfig, binary string) lazyNode {
	t.Helper()
	sn := stargz.Start(t, t.TempDir())
	proxy := sn.ProxyPlugin()
	if c.export {
		proxy += "  [proxy_plugins.stargz.exports]\n    enable_remote_snapshot_annotations = \"true\"\n"
	}
	opts := daemon.Options{HostsDir: base.hostsDir, ExtraConfig: proxy, Binary: binary, Snapshotter: stargz.Name, NoUnpackConfig: !c.unpackConfig}
	if c.annotations {
		opts.CRIImages = stargz.CRIImages
	}
	if c.handler {
		// CRI's snapshotter and the unpack_config stay the default one.
		opts.Snapshotter, opts.NoUnpackConfig = "", false
		opts.CRIImages += "  [plugins.\"io.containerd.cri.v1.images\".runtime_platforms.lazy]\n    snapshotter = \"stargz\"\n"
	}
	n := *base
	n.t = t
	n.d = daemon.Start(t, opts)
	n.connect()
	return lazyNode{env: &n, sn: sn}
}

// pull CRI-pulls ref as kubelet does for a pod of the config.
func (n lazyNode) pull(c lazyConfig, ref string) error {
	spec := criImage(ref)
	var sandbox *criapi.PodSandboxConfig
	if c.handler {
		spec.RuntimeHandler = "lazy"
		sandbox = &criapi.PodSandboxConfig{Metadata: &criapi.PodSandboxMetadata{Name: "lazy", Namespace: "default", Uid: "lazy-uid"}}
	}
	_, err := n.images.PullImage(context.Background(), spec, nil, sandbox)
	return err
}

// remoteSnapshots counts the snapshots stargz mounted lazily.
func (n lazyNode) remoteSnapshots(t *testing.T) int {
	remote := 0
	for _, info := range n.sn.Snapshots(t) {
		if stargz.IsRemote(info) {
			remote++
		}
	}
	return remote
}

// layerFetches are containerd's own GETs of img's layer blobs; stargz's
// reads of the same blobs are its lazy pulling.
func layerFetches(r *registry.Registry, img registry.Pushed) []string {
	var out []string
	for _, req := range r.Requests() {
		if req.FromContainerd() && req.Kind == registry.KindBlob && req.Method == "GET" && slices.Contains(img.Layers, digest.Digest(req.Reference)) {
			out = append(out, req.Reference)
		}
	}
	return out
}

// TestLazyPull: under every config from the remote snapshotters' install
// docs, an eStargz image pulls through CRI lazily on Pullwise as on stock
// (containerd fetches the manifest and the config, no layer; stargz
// mounts every layer remotely), and Pullwise records the pull source,
// streams the layers as lazy, and counts them.
func TestLazyPull(t *testing.T) {
	if err := stargz.FUSE(); err != nil {
		t.Skipf("no FUSE on this machine, so no remote snapshotter: %v", err)
	}
	base := newRegistriesOnly(t)
	for i, c := range lazyConfigs {
		t.Run(c.name, func(t *testing.T) {
			repo := fmt.Sprintf("lazy/app%d", i)
			img := base.upstream.PushEStargz(t, repo, "v1", registry.Image{Layers: []int64{1 << 20, 2 << 20}, Seed: int64(7200 + i)})
			if c.stock {
				base.upstream.Reset()
				stock := newLazyNode(t, base, c, daemon.Bin("containerd-stock"))
				if err := stock.pull(c, img.Ref); err != nil {
					t.Fatalf("stock: PullImage: %v", err)
				}
				if got := layerFetches(base.upstream, img); len(got) > 0 {
					t.Fatalf("stock fetched layers %v: the config does not pull lazily, so it proves nothing", got)
				}
				if got := stock.remoteSnapshots(t); got != len(img.Layers) {
					t.Fatalf("stock: %d remote snapshots, want %d", got, len(img.Layers))
				}
			}

			base.upstream.Reset()
			n := newLazyNode(t, base, c, "")
			url := n.progressURL(&api.ImagePullProgressRequest{Image: img.Ref})
			lines := readStream(t, context.Background(), url)
			if err := n.pull(c, img.Ref); err != nil {
				t.Fatalf("PullImage: %v", err)
			}
			var got []progressLine
			for l := range lines {
				got = append(got, l)
			}
			if fetched := layerFetches(base.upstream, img); len(fetched) > 0 {
				t.Fatalf("containerd fetched layers %v itself", fetched)
			}
			if remote := n.remoteSnapshots(t); remote != len(img.Layers) {
				t.Fatalf("%d remote snapshots, want one per layer (%d)", remote, len(img.Layers))
			}
			for _, d := range img.Layers {
				l := lastFor(got, d.String())
				if l == nil || l.State != "lazy" || l.Progress != l.Total {
					t.Fatalf("layer %s ended at %+v, want done and lazy; stream %+v", d, l, got)
				}
			}
			labels := n.imageLabels("k8s.io", img.Ref)
			if want := base.upstream.Host() + "/" + repo + ":v1"; labels[pullSourceLabel] != want {
				t.Fatalf("pull source %q, want %q", labels[pullSourceLabel], want)
			}
			var blobs map[string]struct{ Lazy int }
			if err := json.Unmarshal([]byte(labels[blobSourceLabel]), &blobs); err != nil || blobs[base.upstream.Host()].Lazy != len(img.Layers) {
				t.Fatalf("blobs label %q (%v), want %d lazy layers on %s", labels[blobSourceLabel], err, len(img.Layers), base.upstream.Host())
			}
			// Nothing left to fetch once the layers are mounted: the pull
			// was done fetching (and gave its slot back) before its end.
			if line := logLine(n.d.Log(), "image pull timeline", repo, "fetched=", fmt.Sprintf("lazy_layers=%d", len(img.Layers))); line == "" {
				t.Fatalf("no pull timeline with every blob in and %d lazy layers:\n%s", len(img.Layers), n.d.LogTail(30))
			}
			if got := n.metric("pullwise_lazy_layers_total"); got != float64(len(img.Layers)) {
				t.Fatalf("pullwise_lazy_layers_total = %v, want %d", got, len(img.Layers))
			}
			// Once there, the image takes the fast path, as any image.
			if err := n.pull(c, img.Ref); err != nil {
				t.Fatalf("second PullImage: %v", err)
			}
			if got := n.metric(`pullwise_pulls_total{outcome="fast_path"}`); got != 1 {
				t.Fatalf(`pullwise_pulls_total{outcome="fast_path"} = %v after a second pull, want 1`, got)
			}
		})
	}
}

// TestLazySnapshotterPlainImage: a plain gzip image through the same
// snapshotter cannot be mounted lazily; containerd fetches every layer and
// Pullwise unpacks it as usual.
func TestLazySnapshotterPlainImage(t *testing.T) {
	if err := stargz.FUSE(); err != nil {
		t.Skipf("no FUSE on this machine, so no remote snapshotter: %v", err)
	}
	base := newRegistriesOnly(t)
	img := base.push("lazy/plain", "v1", registry.Image{Layers: []int64{1 << 20, 1 << 20}, Seed: 7300})
	c := lazyConfigs[0]
	n := newLazyNode(t, base, c, "")
	if err := n.pull(c, img.Ref); err != nil {
		t.Fatalf("PullImage: %v", err)
	}
	if got := layerFetches(base.upstream, img); len(got) != len(img.Layers) {
		t.Fatalf("containerd fetched layers %v, want each of %v once", got, img.Layers)
	}
	if got := n.remoteSnapshots(t); got != 0 {
		t.Fatalf("%d remote snapshots of a plain image", got)
	}
	if got := n.metric("pullwise_lazy_layers_total"); got != 0 {
		t.Fatalf("pullwise_lazy_layers_total = %v for a plain image", got)
	}
	if line := logLine(n.d.Log(), "image pull timeline", "lazy/plain"); line == "" {
		t.Fatal("the pull went past Pullwise's transfer service: no pull timeline")
	}
}

// TestUnservableSnapshotter: a runtime handler whose snapshotter is not
// loaded cannot be unpacked into by the transfer service. cri-pull refuses
// that at start, naming the key to add, and CRI keeps its own local path,
// so pulls work as on stock.
func TestUnservableSnapshotter(t *testing.T) {
	e := newEnv(t, envOptions{criImages: criAnnotations.toml +
		"  [plugins.\"io.containerd.cri.v1.images\".runtime_platforms.ghost]\n    snapshotter = \"ghost\"\n"})
	if line := logLine(e.d.Log(), "!!!", `snapshotter = \"ghost\"`, "unpack_config"); line == "" {
		t.Fatalf("no warning at start naming the unpack_config to add:\n%s", e.d.LogTail(40))
	}
	img := e.push("lazy/ghost", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 7400})
	e.criPull(img.Ref)
	out, err := e.pullctl("version", "-o", "json")
	var v struct {
		CRIPullsUseTransfer *bool `json:"criPullsUseTransfer"`
	}
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.CRIPullsUseTransfer == nil || *v.CRIPullsUseTransfer {
		t.Fatalf("pullctl version does not say CRI pulls bypass Pullwise: %v\n%s", err, out)
	}
}

// newRegistriesOnly is an env with its registries and hosts.toml but no
// containerd yet, for tests that start their own.
func newRegistriesOnly(t *testing.T) *env {
	e := &env{t: t, hostsDir: t.TempDir()}
	e.upstream = registry.Start(t, registry.Options{Name: "upstream"})
	e.writeHosts()
	return e
}
