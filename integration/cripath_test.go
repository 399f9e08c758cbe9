package integration

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	"github.com/opencontainers/go-digest"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
	"github.com/pullwise/pullwise/integration/snapshotter"
)

// criPullConfig is a CRI image config nodes ship; every one but the default
// sends stock CRI down its local pull path (client.Pull).
type criPullConfig struct {
	name string
	toml string // lines for [plugins."io.containerd.cri.v1.images"]
}

var (
	criDefault     = criPullConfig{name: "default"}
	criDiscard     = criPullConfig{name: "discard_unpacked_layers", toml: "  discard_unpacked_layers = true\n"} // EKS, GKE, Talos
	criLocalPull   = criPullConfig{name: "use_local_image_pull", toml: "  use_local_image_pull = true\n"}       // RKE2, k3s
	criSyncFs      = criPullConfig{name: "image_pull_with_sync_fs", toml: "  image_pull_with_sync_fs = true\n"}
	criAnnotations = criPullConfig{name: "snapshot_annotations", toml: "  disable_snapshot_annotations = false\n"}

	criPullConfigs = []criPullConfig{criDefault, criDiscard, criLocalPull, criSyncFs, criAnnotations}
)

// forEachCRIPullConfig runs test once per CRI image config of the matrix:
// what a feature does under the default config it must do under each.
func forEachCRIPullConfig(t *testing.T, test func(t *testing.T, criImages string)) {
	for _, c := range criPullConfigs {
		t.Run(c.name, func(t *testing.T) { test(t, c.toml) })
	}
}

// collectGarbage runs containerd's GC to completion: deleting a lease
// synchronously collects before it returns.
func (e *env) collectGarbage() {
	e.t.Helper()
	ctx := inNamespace("k8s.io")
	c := leasesapi.NewLeasesClient(e.conn)
	l, err := c.Create(ctx, &leasesapi.CreateRequest{})
	if err != nil {
		e.t.Fatalf("create lease: %v", err)
	}
	if _, err := c.Delete(ctx, &leasesapi.DeleteRequest{ID: l.GetLease().GetID(), Sync: true}); err != nil {
		e.t.Fatalf("delete lease (sync GC): %v", err)
	}
}

// upstreamRequestsOf returns the requests upstream saw for one CRI pull
// of ref, and nothing before it.
func (e *env) upstreamRequestsOf(ref string) []registry.Request {
	e.t.Helper()
	reqs, err := e.requestsOfPull(ref, nil)
	if err != nil {
		e.t.Fatalf("PullImage %s: %v", ref, err)
	}
	return reqs
}

// requestsOfPull counts what upstream saw for one CRI pull of ref with
// auth, and returns the pull's error.
func (e *env) requestsOfPull(ref string, auth *criapi.AuthConfig) ([]registry.Request, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.upstream.WaitIdle(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.upstream.Reset()
	_, err := e.images.PullImage(ctx, criImage(ref), auth, nil)
	if err := e.upstream.WaitIdle(ctx); err != nil {
		e.t.Fatal(err)
	}
	return e.upstream.Requests(), err
}

// committed lists which of ds are in the content store.
func (e *env) committed(ds ...digest.Digest) []digest.Digest {
	e.t.Helper()
	var out []digest.Digest
	for _, d := range ds {
		if e.contentCommitted("k8s.io", d) {
			out = append(out, d)
		}
	}
	return out
}

// TestCRIPullsReachPullwiseUnderEveryConfig: whatever CRI's image config,
// CRI pulls go through Pullwise (the pull is listed, labelled with its
// source) and CRI sees the image as after its own pull: tag, repo digest
// and ID records with CRI's managed label, ImageStatus at once.
func TestCRIPullsReachPullwiseUnderEveryConfig(t *testing.T) {
	forEachCRIPullConfig(t, func(t *testing.T, criImages string) {
		e := newEnv(t, envOptions{mirror: mirrorSeeded, criImages: criImages})
		resp, err := e.pullwise.Version(context.Background(), &api.VersionRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetCriPullsUseTransfer() || len(resp.GetWarnings()) != 0 {
			t.Fatalf("Version: cri_pulls_use_transfer=%v warnings=%q", resp.GetCriPullsUseTransfer(), resp.GetWarnings())
		}
		if strings.Contains(e.d.Log(), "CRI pulls bypass the transfer service") {
			t.Fatal("start-up log warns that CRI pulls bypass Pullwise")
		}
		img := e.push("reach/app", "v1", registry.Image{Layers: []int64{32 << 10, 32 << 10}, Seed: 2900})
		id, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, sandbox("reach"))
		if err != nil {
			t.Fatal(err)
		}
		if id != img.Config.String() {
			t.Fatalf("PullImage returned %q, want the image ID %s", id, img.Config)
		}
		st, err := e.images.ImageStatus(context.Background(), criImage(img.Ref), false)
		if err != nil || st.GetImage().GetId() != id {
			t.Fatalf("ImageStatus right after PullImage: %v %v", st.GetImage(), err)
		}
		repoDigest := digestRef(e.upstream.Host(), "reach/app", img)
		if !contains(st.GetImage().GetRepoTags(), img.Ref) || !contains(st.GetImage().GetRepoDigests(), repoDigest) {
			t.Fatalf("ImageStatus names %v / %v", st.GetImage().GetRepoTags(), st.GetImage().GetRepoDigests())
		}
		for _, name := range []string{img.Ref, repoDigest, id} {
			if got := e.imageLabels("k8s.io", name)["io.cri-containerd.image"]; got != "managed" {
				t.Errorf("record %s: io.cri-containerd.image = %q, want managed", name, got)
			}
		}
		e.assertSource(img.Ref, img, e.mirror.Host()+"/reach/app:v1")
		if got := e.metric(`pullwise_pulls_total{outcome="pulled"}`); got != 1 {
			t.Fatalf(`pullwise_pulls_total{outcome="pulled"} = %v: the pull did not go through Pullwise`, got)
		}
		// Every metadata write of the pull took its turn, and shows.
		turns, writes := e.metric(`pullwise_metadata_write_seconds_count{phase="turn"}`), e.metric(`pullwise_metadata_write_seconds_count{phase="write"}`)
		if writes == 0 || turns != writes {
			t.Errorf("pullwise_metadata_write_seconds_count: %v turns, %v writes; want the pull's writes, each with its turn", turns, writes)
		}
	})
}

// TestDiscardUnpackedLayers: with discard_unpacked_layers, a pull leaves no
// layer blob once GC ran, as stock's local path does in the same test, and
// keeps manifest, config and snapshots: a container runs from the image,
// and a re-pull costs one HEAD and no blob.
func TestDiscardUnpackedLayers(t *testing.T) {
	e, pause := newPodEnv(t, envOptions{criImages: criDiscard.toml})
	app := e.pushRunnable("discard/app", "v1", 9200)
	ctx := context.Background()

	stock := e.sibling(daemon.Options{Binary: daemon.Bin("containerd-stock"), CRIImages: criDiscard.toml})
	for _, d := range []struct {
		name string
		e    *env
	}{{"stock", stock}, {"pullwise", e}} {
		if _, err := d.e.images.PullImage(ctx, criImage(app.Ref), nil, nil); err != nil {
			t.Fatalf("%s: PullImage: %v", d.name, err)
		}
		d.e.collectGarbage()
		if kept := d.e.committed(app.Layers...); len(kept) != 0 {
			t.Errorf("%s: layer blobs %v still in the content store after GC", d.name, kept)
		}
		if kept := d.e.committed(app.Digest, app.Config); len(kept) != 2 {
			t.Errorf("%s: manifest and config: only %v kept", d.name, kept)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	id, err := e.images.PullImage(ctx, criImage(app.Ref), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	podID, podCfg := e.runPod(t, "discard")
	e.startContainer(t, e.createContainer(t, podID, podCfg, "app", id))
	// RunPodSandbox pulled the sandbox image through Pullwise too: CRI
	// would have pulled it in process, on its local path.
	pauseLabels := e.imageLabels("k8s.io", pause.Ref)
	if got, want := pauseLabels[pullSourceLabel], e.upstream.Host()+"/pods/pause:3.10"; got != want {
		t.Errorf("sandbox image pulled by RunPodSandbox: %s = %q, want %q", pullSourceLabel, got, want)
	}
	if got := pauseLabels["io.cri-containerd.pinned"]; got != "pinned" {
		t.Errorf("sandbox image pulled by RunPodSandbox: io.cri-containerd.pinned = %q, want pinned", got)
	}

	if reqs := e.upstreamRequestsOf(app.Ref); len(reqs) != 1 || reqs[0].Method != "HEAD" {
		t.Fatalf("re-pull of a present image with discarded layers sent %v, want 1 HEAD", reqs)
	}
	e.collectGarbage()
	if kept := e.committed(app.Layers...); len(kept) != 0 {
		t.Fatalf("layers %v kept after the re-pull and GC", kept)
	}

	// An image on the same base fetches only the layer it adds: the base's
	// snapshots are there, though its blobs are not.
	base := registry.Image{Layers: []int64{64 << 10, 64 << 10}, Seed: 2980}
	first := e.push("discard/first", "v1", base)
	if _, err := e.images.PullImage(ctx, criImage(first.Ref), nil, nil); err != nil {
		t.Fatal(err)
	}
	e.collectGarbage()
	onBase := base
	onBase.Files = map[string][]byte{"/second": []byte("second")}
	second := e.push("discard/second", "v1", onBase)
	if second.Layers[0] != first.Layers[0] || second.Layers[1] != first.Layers[1] {
		t.Fatalf("the images share no base: %v and %v", first.Layers, second.Layers)
	}
	var got []string
	for _, r := range e.upstreamRequestsOf(second.Ref) {
		if r.Kind == registry.KindBlob && r.Method == "GET" {
			got = append(got, r.Reference)
		}
	}
	want := []string{second.Config.String(), second.Layers[2].String()}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("pull on a discarded base fetched blobs %v, want only its config and new layer %v", got, want)
	}
	// It gave its slot back once its own blobs were in, as any pull does,
	// though the base's blobs never came.
	if !timelineHas(e.d.Log(), second.Ref, "fetched=") {
		t.Fatalf("the pull on a discarded base never counted as done fetching:\n%s", logLine(e.d.Log(), "image pull timeline", second.Ref))
	}
}

// TestDeprecatedRegistryMirrors: CRI's deprecated registry.mirrors (with
// no config_path) still send pulls to the mirror first, through Pullwise:
// the pull source names the mirror.
func TestDeprecatedRegistryMirrors(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded})
	img := e.push("mirrors/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 2950})
	mirrors := fmt.Sprintf("[plugins.\"io.containerd.cri.v1.images\".registry.mirrors.%q]\n  endpoint = [%q]\n",
		e.upstream.Host(), e.mirror.URL())
	// A daemon of its own with no hosts.toml: config_path and mirrors
	// cannot both be set.
	m := *e
	m.d = daemon.Start(t, daemon.Options{ExtraConfig: mirrors})
	m.connect()
	m.criPull(img.Ref)
	m.assertSource(img.Ref, img, e.mirror.Host()+"/mirrors/app:v1")
	if err := e.upstream.WaitIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := e.upstream.Count(func(r registry.Request) bool { return r.Kind == registry.KindBlob }); n != 0 {
		t.Fatalf("upstream served %d blobs, want none: the mirror has them", n)
	}
}

// criLabels keeps of each label set the labels snapshot annotations give
// (containerd.io/snapshot/cri.*), leaving out sets with none, ordered by
// layer digest.
func criLabels(sets []map[string]string) []map[string]string {
	var out []map[string]string
	for _, l := range sets {
		kept := map[string]string{}
		for k, v := range l {
			if strings.HasPrefix(k, "containerd.io/snapshot/cri.") {
				kept[k] = v
			}
		}
		if len(kept) > 0 {
			out = append(out, kept)
		}
	}
	slices.SortFunc(out, func(a, b map[string]string) int {
		return strings.Compare(a["containerd.io/snapshot/cri.layer-digest"], b["containerd.io/snapshot/cri.layer-digest"])
	})
	return out
}

// TestSnapshotAnnotations: with snapshot annotations on, a remote
// snapshotter (a recording proxy snapshotter here) receives for each
// layer's snapshot the labels stock's local path gives it, in the same
// test.
func TestSnapshotAnnotations(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("annotations/app", "v1", registry.Image{Layers: []int64{16 << 10, 16 << 10, 16 << 10}, Seed: 2970})
	got := map[string][]map[string]string{}
	for _, name := range []string{"stock", "pullwise"} {
		rec := snapshotter.Start(t, t.TempDir())
		opts := daemon.Options{
			HostsDir:    e.hostsDir,
			CRIImages:   criAnnotations.toml,
			Snapshotter: "recording",
			ExtraConfig: fmt.Sprintf("[proxy_plugins.recording]\n  type = \"snapshot\"\n  address = %q\n", rec.Socket),
		}
		if name == "stock" {
			opts.Binary = daemon.Bin("containerd-stock")
		}
		d := *e
		d.d = daemon.Start(t, opts)
		d.connect()
		d.criPull(img.Ref)
		got[name] = criLabels(rec.Prepared())
	}
	if len(got["stock"]) != len(img.Layers) {
		t.Fatalf("stock gave %d layer snapshots cri.* labels, want one per layer (%d): %v", len(got["stock"]), len(img.Layers), got["stock"])
	}
	if !reflect.DeepEqual(got["stock"], got["pullwise"]) {
		t.Fatalf("labels the snapshotter received differ:\nstock    %v\npullwise %v", got["stock"], got["pullwise"])
	}
}

// TestRegistryConfigsAuth: CRI's deprecated registry.configs auth (which
// sends stock CRI down its local path) is what a pull that carries no
// credentials presents, through Pullwise; a pull's own credentials come
// first.
func TestRegistryConfigsAuth(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("auth/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 2990})
	e.upstream.SetFault(func(registry.Request) *registry.Fault {
		return &registry.Fault{RequireBasicAuth: &registry.BasicAuth{User: "u", Password: "p"}}
	})
	e.restartWith(t, envOptions{extraConfig: fmt.Sprintf(
		"[plugins.\"io.containerd.cri.v1.images\".registry.configs.%q.auth]\n  username = \"u\"\n  password = \"p\"\n", e.upstream.Host())})
	ctx := context.Background()
	wrong := &criapi.AuthConfig{Username: "u", Password: "wrong"}
	if _, err := e.images.PullImage(ctx, criImage(img.Ref), wrong, nil); code(err) != "Unauthenticated" {
		t.Fatalf("pull with its own wrong credentials: %v, want Unauthenticated", err)
	}
	e.criPull(img.Ref)
	e.assertSource(img.Ref, img, e.upstream.Host()+"/auth/app:v1")
	if got := e.metric(`pullwise_pulls_total{outcome="pulled"}`); got != 1 {
		t.Fatalf(`pullwise_pulls_total{outcome="pulled"} = %v, want 1`, got)
	}
}
