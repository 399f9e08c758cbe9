package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	eventtypes "github.com/containerd/containerd/api/events"
	eventsapi "github.com/containerd/containerd/api/services/events/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// Labels and timings from the contract and the issue.
const (
	pinnedLabel = "io.cri-containerd.pinned"
	markerLabel = "io.pullwise.pinned-by"
	// pinDeadline is how soon after an image event its records must be
	// pinned.
	pinDeadline = time.Second
	// criDeadline adds CRI's own event handling, which turns labels into
	// Image.pinned, on top.
	criDeadline = 3 * time.Second
)

var (
	pinnedByConfig = map[string]string{pinnedLabel: "pinned", markerLabel: "config"}
	pinnedByHand   = map[string]string{pinnedLabel: "pinned"}
)

// pinnedImagesTOML configures CRI's pinned_images from key, value pairs.
func pinnedImagesTOML(kv ...string) string {
	var b strings.Builder
	b.WriteString("  [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n")
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, "    %s = %q\n", kv[i], kv[i+1])
	}
	return b.String()
}

// pinEnv adds containerd's own images and events APIs to env: they show
// records and labels exactly, as ctr would.
type pinEnv struct {
	*env
	imagesAPI imagesapi.ImagesClient
	eventsAPI eventsapi.EventsClient
}

// newPinEnv is newEnv for configs that name images on the env's own
// registry, whose address is known only once it runs.
func newPinEnv(t *testing.T, opts func(host string) envOptions) *pinEnv {
	t.Helper()
	e := &env{t: t, hostsDir: t.TempDir()}
	e.upstream = registry.Start(t, registry.Options{Name: "upstream"})
	e.writeHosts()
	o := opts(e.upstream.Host())
	e.d = daemon.Start(t, daemon.Options{HostsDir: e.hostsDir, CRIImages: o.criImages, ExtraConfig: o.extraConfig})
	e.connect()
	return &pinEnv{env: e, imagesAPI: imagesapi.NewImagesClient(e.conn), eventsAPI: eventsapi.NewEventsClient(e.conn)}
}

// pinSandbox pins host/repo as the sandbox image.
func pinSandbox(repo string) func(host string) envOptions {
	return func(host string) envOptions {
		return envOptions{criImages: pinnedImagesTOML("sandbox", host+"/"+repo)}
	}
}

// names of a pulled image as CRI knows them.
func tagRef(img registry.Pushed) string { return img.Ref }
func repoDigestRef(img registry.Pushed) string {
	return img.Ref[:strings.LastIndex(img.Ref, ":")] + "@" + img.Digest.String()
}
func imageID(img registry.Pushed) string { return img.Config.String() }

// records returns the labels of every k8s.io record whose target is
// manifest, by record name.
func (p *pinEnv) records(manifest digest.Digest) map[string]map[string]string {
	p.t.Helper()
	resp, err := p.imagesAPI.List(inNamespace("k8s.io"), &imagesapi.ListImagesRequest{Filters: []string{"target.digest==" + manifest.String()}})
	if err != nil {
		p.t.Fatalf("list images: %v", err)
	}
	recs := map[string]map[string]string{}
	for _, img := range resp.GetImages() {
		recs[img.GetName()] = img.GetLabels()
	}
	return recs
}

// pinLabels returns the two pin labels out of labels.
func pinLabels(labels map[string]string) map[string]string {
	m := map[string]string{}
	for _, k := range []string{pinnedLabel, markerLabel} {
		if v, ok := labels[k]; ok {
			m[k] = v
		}
	}
	return m
}

// criPinned reports Image.pinned as ImageStatus shows it for ref, and as
// ListImages shows it for the same image.
func (p *pinEnv) criPinned(ref string) (byStatus, byList bool, err error) {
	st, err := p.images.ImageStatus(context.Background(), &criapi.ImageSpec{Image: ref}, false)
	if err != nil {
		return false, false, err
	}
	if st.GetImage() == nil {
		return false, false, fmt.Errorf("CRI does not know %s", ref)
	}
	list, err := p.images.ListImages(context.Background(), nil)
	if err != nil {
		return false, false, err
	}
	for _, img := range list {
		if img.GetId() == st.GetImage().GetId() {
			return st.GetImage().GetPinned(), img.GetPinned(), nil
		}
	}
	return false, false, fmt.Errorf("ListImages lacks %s (%s)", ref, st.GetImage().GetId())
}

// requirePins waits until every k8s.io record of img carries exactly
// labels as pin labels, names being among them, and CRI reports pinned
// (want) under each name, in ImageStatus and ListImages.
func (p *pinEnv) requirePins(img registry.Pushed, labels map[string]string, criWant bool, names ...string) {
	p.t.Helper()
	eventually(p.t, pinDeadline, fmt.Sprintf("pin labels %v on the records of %s", labels, img.Ref), func() bool {
		recs := p.records(img.Digest)
		for _, n := range names {
			if _, ok := recs[n]; !ok {
				return false
			}
		}
		for _, l := range recs {
			if !maps.Equal(pinLabels(l), labels) {
				return false
			}
		}
		return true
	})
	for _, n := range names {
		eventually(p.t, criDeadline, fmt.Sprintf("CRI pinned=%v for %s", criWant, n), func() bool {
			byStatus, byList, err := p.criPinned(n)
			return err == nil && byStatus == criWant && byList == criWant
		})
	}
}

func (p *pinEnv) requirePinnedByConfig(img registry.Pushed, names ...string) {
	p.t.Helper()
	p.requirePins(img, pinnedByConfig, true, names...)
}

func (p *pinEnv) requireUnpinned(img registry.Pushed, names ...string) {
	p.t.Helper()
	p.requirePins(img, map[string]string{}, false, names...)
}

func (p *pinEnv) criPull(ref string) {
	p.t.Helper()
	if _, err := p.images.PullImage(context.Background(), criImage(ref), nil, nil); err != nil {
		p.t.Fatalf("CRI PullImage %s: %v", ref, err)
	}
}

func (p *pinEnv) ctrOK(ns string, args ...string) string {
	p.t.Helper()
	out, err := p.ctr(ns, args...)
	if err != nil {
		p.t.Fatalf("ctr -n %s %s: %v\n%s", ns, strings.Join(args, " "), err, out)
	}
	return out
}

// requireLabelsRewritten runs action and waits until containerd publishes an
// update of record name that lacks a pin label, the proof that action
// replaced the record's labels (and so that pinning had to restore them).
func (p *pinEnv) requireLabelsRewritten(name string, action func()) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(inNamespace("k8s.io"), 2*time.Minute)
	defer cancel()
	stream, err := p.eventsAPI.Subscribe(ctx, &eventsapi.SubscribeRequest{
		Filters: []string{`topic=="/images/update",namespace=="k8s.io"`},
	})
	if err != nil {
		p.t.Fatalf("subscribe to image events: %v", err)
	}
	next := func() *eventtypes.ImageUpdate {
		env, err := stream.Recv()
		if err != nil {
			p.t.Fatalf("image events: %v", err)
		}
		var u eventtypes.ImageUpdate
		if err := env.GetEvent().UnmarshalTo(&u); err != nil {
			p.t.Fatalf("decode %s: %v", env.GetTopic(), err)
		}
		return &u
	}

	// The subscription is live once it delivers an update made after it.
	// (The images service dereferences the target even when the mask
	// names labels only.)
	const sentinel = "io.pullwise.test/sentinel"
	got, err := p.imagesAPI.Get(inNamespace("k8s.io"), &imagesapi.GetImageRequest{Name: name})
	if err != nil {
		p.t.Fatalf("get %s: %v", name, err)
	}
	if _, err := p.imagesAPI.Update(inNamespace("k8s.io"), &imagesapi.UpdateImageRequest{
		Image:      &imagesapi.Image{Name: name, Target: got.GetImage().GetTarget(), Labels: map[string]string{sentinel: "1"}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels." + sentinel}},
	}); err != nil {
		p.t.Fatalf("label %s: %v", name, err)
	}
	for u := next(); u.GetName() != name || u.GetLabels()[sentinel] == ""; u = next() {
	}

	action()
	for {
		u := next()
		if u.GetName() == name && !maps.Equal(pinLabels(u.GetLabels()), pinnedByConfig) {
			return
		}
	}
}

// rewriteConfig replaces old with new in the daemon's config and restarts
// it on the same root and state.
func (p *pinEnv) rewriteConfig(old, new string) {
	p.t.Helper()
	path := filepath.Join(p.d.Dir, "config.toml")
	b, err := os.ReadFile(path)
	if err != nil {
		p.t.Fatal(err)
	}
	if strings.Count(string(b), old) != 1 {
		p.t.Fatalf("config has %d occurrences of %q, want 1:\n%s", strings.Count(string(b), old), old, b)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o600); err != nil {
		p.t.Fatal(err)
	}
	p.d.Restart(p.t)
}

// requireRefused checks err is the pinning guard's refusal naming why.
func requireRefused(t *testing.T, what string, err error, wantMsg ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s of a pinned image succeeded", what)
	}
	st, _ := status.FromError(err)
	if st.Code() != codes.FailedPrecondition {
		t.Fatalf("%s: code %v (%v), want FailedPrecondition", what, st.Code(), err)
	}
	for _, m := range append([]string{"is pinned", `protect_pinned_images = false in [plugins."io.containerd.grpc.v1.pullwise"]`}, wantMsg...) {
		if !strings.Contains(st.Message(), m) {
			t.Errorf("%s: message lacks %q:\n%s", what, m, st.Message())
		}
	}
}

// Small distinct images: what matters is their names and digests.
var (
	pauseImage    = registry.Image{Layers: []int64{32 << 10}, Seed: 70}
	newPauseImage = registry.Image{Layers: []int64{32 << 10}, Seed: 71}
	appImage      = registry.Image{Layers: []int64{32 << 10}, Seed: 72}
	toolImage     = registry.Image{Layers: []int64{32 << 10}, Seed: 73}
)

func TestPinningCRIPullOfSandboxImage(t *testing.T) {
	p := newPinEnv(t, pinSandbox("pause:3.10"))
	pause := p.push("pause", "3.10", pauseImage)
	app := p.push("team/app", "1", appImage)

	p.criPull(pause.Ref)
	p.criPull(app.Ref)
	p.requirePinnedByConfig(pause, tagRef(pause), repoDigestRef(pause), imageID(pause))
	p.requireUnpinned(app, tagRef(app), repoDigestRef(app), imageID(app))

	// Operators see both labels with ctr, and the flag with pullctl.
	line := p.ctrLine(pause.Ref)
	if !strings.Contains(line, "io.cri-containerd.pinned=pinned") || !strings.Contains(line, "io.pullwise.pinned-by=config") {
		t.Errorf("ctr -n k8s.io images ls does not show the pin of %s:\n%s", pause.Ref, line)
	}
	out, err := p.pullctl("images", "-o", "json")
	if err != nil {
		t.Fatalf("pullctl images -o json: %v\n%s", err, out)
	}
	var list struct {
		Images []struct {
			ID     string `json:"id"`
			Pinned bool   `json:"pinned"`
		} `json:"images"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decode pullctl images -o json: %v\n%s", err, out)
	}
	for _, img := range list.Images {
		if want := img.ID == imageID(pause); img.Pinned != want {
			t.Errorf("pullctl images: %s pinned %v, want %v", img.ID, img.Pinned, want)
		}
	}
}

// ctrLine returns the line of `ctr -n k8s.io images ls` for ref.
func (p *pinEnv) ctrLine(ref string) string {
	p.t.Helper()
	out := p.ctrOK("k8s.io", "images", "ls")
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, ref+" ") {
			return line
		}
	}
	p.t.Fatalf("ctr -n k8s.io images ls lacks %s:\n%s", ref, out)
	return ""
}

func TestPinningCtrPull(t *testing.T) {
	p := newPinEnv(t, pinSandbox("pause:3.10"))
	pause := p.push("pause", "3.10", pauseImage)

	p.ctrOK("k8s.io", "image", "pull", "--plain-http", pause.Ref)
	// CRI adds the image ID record when it learns of the image.
	p.requirePinnedByConfig(pause, tagRef(pause), imageID(pause))
}

func TestPinningCtrImport(t *testing.T) {
	p := newPinEnv(t, pinSandbox("pause:3.10"))
	pause := p.push("pause", "3.10", pauseImage)

	// An archive of the image, made in another namespace so that k8s.io
	// first sees the image through the import. --local: through the
	// transfer service, ctr can exit before it has written the whole
	// archive.
	archive := filepath.Join(t.TempDir(), "pause.tar")
	p.ctrOK("default", "image", "pull", "--plain-http", pause.Ref)
	p.ctrOK("default", "images", "export", "--local", archive, pause.Ref)

	p.ctrOK("k8s.io", "images", "import", archive)
	p.requirePinnedByConfig(pause, tagRef(pause), imageID(pause))

	// Importing over the existing image replaces its labels.
	p.requireLabelsRewritten(tagRef(pause), func() {
		p.ctrOK("k8s.io", "images", "import", archive)
	})
	p.requirePinnedByConfig(pause, tagRef(pause), imageID(pause))
}

func TestPinningSurvivesRePulls(t *testing.T) {
	p := newPinEnv(t, pinSandbox("pause:3.10"))
	pause := p.push("pause", "3.10", pauseImage)
	p.criPull(pause.Ref)
	names := []string{tagRef(pause), repoDigestRef(pause), imageID(pause)}
	p.requirePinnedByConfig(pause, names...)

	// Re-pulls of the unchanged tag: Pullwise's fast path leaves the
	// records alone, so the pins simply stay.
	p.ctrOK("k8s.io", "image", "pull", "--plain-http", pause.Ref)
	p.criPull(pause.Ref)
	p.requirePinnedByConfig(pause, names...)

	// The tag moves: the transfer service updates the existing record
	// without field paths, and the new image arrives without pins. A ctr
	// pull leaves it without labels, a CRI pull with CRI's own.
	moved := p.upstream.Push(t, "pause", "3.10", newPauseImage)
	p.requireLabelsRewritten(tagRef(pause), func() {
		p.ctrOK("k8s.io", "image", "pull", "--plain-http", pause.Ref)
	})
	movedNames := []string{tagRef(moved)} // ctr names only the tag
	p.requirePinnedByConfig(moved, movedNames...)

	again := p.upstream.Push(t, "pause", "3.10", pauseImage)
	p.requireLabelsRewritten(tagRef(pause), func() { p.criPull(pause.Ref) })
	p.requirePinnedByConfig(again, names...)
}

func TestPinningImagePresentBeforeStart(t *testing.T) {
	// Start with another sandbox image, so the one pulled is not pinned.
	p := newPinEnv(t, pinSandbox("pause:placeholder"))
	pause := p.push("pause", "3.10", pauseImage)
	p.criPull(pause.Ref)
	names := []string{tagRef(pause), repoDigestRef(pause), imageID(pause)}
	p.requireUnpinned(pause, names...)

	p.rewriteConfig(`pause:placeholder"`, `pause:3.10"`)
	p.requirePinnedByConfig(pause, names...)
}

func TestPinningNonNormalizedConfigName(t *testing.T) {
	// No tag in config; CRI and ctr store the image as :latest, a name
	// upstream never compares equal to the config value.
	p := newPinEnv(t, pinSandbox("pause"))
	pause := p.push("pause", "latest", pauseImage)

	p.criPull(strings.TrimSuffix(pause.Ref, ":latest"))
	p.requirePinnedByConfig(pause, tagRef(pause), repoDigestRef(pause), imageID(pause))
}

func TestPinningAfterRestart(t *testing.T) {
	p := newPinEnv(t, func(host string) envOptions {
		return envOptions{criImages: pinnedImagesTOML("sandbox", host+"/pause:3.10", "base", host+"/base:1")}
	})
	pause := p.push("pause", "3.10", pauseImage)
	base := p.push("base", "1", appImage)
	p.criPull(pause.Ref)
	names := []string{tagRef(pause), repoDigestRef(pause), imageID(pause)}
	p.requirePinnedByConfig(pause, names...)

	p.d.Restart(t)
	p.requirePinnedByConfig(pause, names...)
	// And pinning follows new images after the restart.
	p.ctrOK("k8s.io", "image", "pull", "--plain-http", base.Ref)
	p.requirePinnedByConfig(base, tagRef(base), imageID(base))
}

func TestPinningConfigChangeUnpinsOnlyConfigPins(t *testing.T) {
	p := newPinEnv(t, pinSandbox("pause:3.10"))
	oldPause := p.push("pause", "3.10", pauseImage)
	newPause := p.push("pause", "3.11", newPauseImage)
	tool := p.push("team/tool", "1", toolImage)
	for _, img := range []registry.Pushed{oldPause, newPause, tool} {
		p.criPull(img.Ref)
	}
	oldNames := []string{tagRef(oldPause), repoDigestRef(oldPause), imageID(oldPause)}
	newNames := []string{tagRef(newPause), repoDigestRef(newPause), imageID(newPause)}
	p.requirePinnedByConfig(oldPause, oldNames...)
	p.requireUnpinned(newPause, newNames...)
	// An operator pins the tool by hand, on its tag record only.
	p.ctrOK("k8s.io", "images", "label", tool.Ref, pinnedLabel+"=pinned")

	p.rewriteConfig(`pause:3.10"`, `pause:3.11"`)
	p.requirePinnedByConfig(newPause, newNames...)
	p.requireUnpinned(oldPause, oldNames...)

	recs := p.records(tool.Digest)
	if got := pinLabels(recs[tool.Ref]); !maps.Equal(got, pinnedByHand) {
		t.Fatalf("hand pin on %s became %v", tool.Ref, got)
	}
	if got := pinLabels(recs[imageID(tool)]); len(got) != 0 {
		t.Fatalf("pinning labelled the hand-pinned image's ID record: %v", got)
	}
	for _, n := range []string{tagRef(tool), imageID(tool)} {
		if st, listed, err := p.criPinned(n); err != nil || !st || !listed {
			t.Fatalf("CRI pinned for %s: status %v, list %v, err %v; want the hand pin reported", n, st, listed, err)
		}
	}

	// No longer pinned, the old sandbox image can go.
	if err := p.images.RemoveImage(context.Background(), criImage(oldPause.Ref)); err != nil {
		t.Fatalf("RemoveImage of the unpinned old sandbox image: %v", err)
	}
	if recs := p.records(oldPause.Digest); len(recs) != 0 {
		t.Fatalf("records of the old sandbox image left after RemoveImage: %v", recs)
	}
}

func TestPinningRefusesRemoval(t *testing.T) {
	p := newPinEnv(t, pinSandbox("pause:3.10"))
	pause := p.push("pause", "3.10", pauseImage)
	tool := p.push("team/tool", "1", toolImage)
	app := p.push("team/app", "1", appImage)
	for _, img := range []registry.Pushed{pause, tool, app} {
		p.criPull(img.Ref)
	}
	names := []string{tagRef(pause), repoDigestRef(pause), imageID(pause)}
	p.requirePinnedByConfig(pause, names...)
	p.ctrOK("k8s.io", "images", "label", tool.Ref, pinnedLabel+"=pinned")

	ctx := context.Background()
	configWhy := []string{`pinned_images.sandbox in [plugins."io.containerd.cri.v1.images"]`, "change pinned_images.sandbox"}
	truncatedID := "sha256:" + pause.Config.Encoded()[:12]
	for _, n := range []string{tagRef(pause), repoDigestRef(pause), imageID(pause), truncatedID} {
		requireRefused(t, "CRI RemoveImage "+n, p.images.RemoveImage(ctx, criImage(n)), configWhy...)
	}
	handWhy := []string{"ctr -n k8s.io images label " + tool.Ref + " " + pinnedLabel + "="}
	requireRefused(t, "CRI RemoveImage of a hand-pinned image", p.images.RemoveImage(ctx, criImage(imageID(tool))), handWhy...)

	// ctr goes through containerd's images service; it exits non-zero and
	// prints the reason.
	for _, n := range []string{tagRef(pause), imageID(pause)} {
		out, err := p.ctr("k8s.io", "images", "rm", n)
		if err == nil || !strings.Contains(out, "is pinned") || !strings.Contains(out, "pinned_images.sandbox") ||
			!strings.Contains(out, "protect_pinned_images = false") {
			t.Errorf("ctr -n k8s.io images rm %s: err %v, want a refusal naming the config key:\n%s", n, err, out)
		}
	}
	out, err := p.ctr("k8s.io", "images", "rm", tool.Ref)
	if err == nil || !strings.Contains(out, handWhy[0]) {
		t.Errorf("ctr -n k8s.io images rm of a hand-pinned image: err %v, want a refusal saying how to unpin:\n%s", err, out)
	}
	p.requirePinnedByConfig(pause, names...)

	// Unpinned images, and other namespaces, are not guarded.
	if err := p.images.RemoveImage(ctx, criImage(app.Ref)); err != nil {
		t.Fatalf("RemoveImage of an unpinned image: %v", err)
	}
	p.ctrOK("default", "image", "pull", "--plain-http", pause.Ref)
	p.ctrOK("default", "images", "rm", pause.Ref)
}

func TestPinningProtectionDisabled(t *testing.T) {
	p := newPinEnv(t, func(host string) envOptions {
		o := pinSandbox("pause:3.10")(host)
		o.extraConfig = "[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  protect_pinned_images = false\n"
		return o
	})
	pause := p.push("pause", "3.10", pauseImage)
	p.criPull(pause.Ref)
	p.requirePinnedByConfig(pause, tagRef(pause), repoDigestRef(pause), imageID(pause))

	// Still pinned, but removal works as upstream.
	if err := p.images.RemoveImage(context.Background(), criImage(pause.Ref)); err != nil {
		t.Fatalf("RemoveImage with protect_pinned_images = false: %v", err)
	}
	if recs := p.records(pause.Digest); len(recs) != 0 {
		t.Fatalf("records left after RemoveImage: %v", recs)
	}

	p.ctrOK("k8s.io", "image", "pull", "--plain-http", pause.Ref)
	p.requirePinnedByConfig(pause, tagRef(pause), imageID(pause))
	p.ctrOK("k8s.io", "images", "rm", tagRef(pause), imageID(pause))
	if recs := p.records(pause.Digest); len(recs) != 0 {
		t.Fatalf("records left after ctr images rm: %v", recs)
	}
}
