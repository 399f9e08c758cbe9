package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

const (
	pullSourceLabel = "io.pullwise.pull-source"
	blobSourceLabel = "io.pullwise.pull-source.blobs"
)

// setMirror rewrites hosts.toml for upstream: mirrorURL with caps in front
// of it, or no mirror when mirrorURL is empty.
func (e *env) setMirror(mirrorURL string, caps ...string) {
	e.writeHostsFor(e.upstream.Host(), e.upstream.URL(), mirrorURL, caps...)
}

// imageLabels reads an image record's labels straight from containerd's
// images API, as `ctr images ls` would show them.
func (e *env) imageLabels(ns, name string) map[string]string {
	e.t.Helper()
	img, err := e.getImage(ns, name)
	if err != nil {
		e.t.Fatalf("get image %s: %v", name, err)
	}
	return img.GetLabels()
}

// getImage reads an image record through containerd's images API.
func (e *env) getImage(ns, name string) (*imagesapi.Image, error) {
	resp, err := imagesapi.NewImagesClient(e.conn).Get(inNamespace(ns), &imagesapi.GetImageRequest{Name: name})
	return resp.GetImage(), err
}

// contentCommitted says whether blob d is committed to containerd's
// content store, as `ctr content ls` would list it.
func (e *env) contentCommitted(ns string, d digest.Digest) bool {
	e.t.Helper()
	_, err := contentapi.NewContentClient(e.conn).Info(inNamespace(ns), &contentapi.InfoRequest{Digest: d.String()})
	if status.Code(err) == codes.NotFound {
		return false
	}
	if err != nil {
		e.t.Fatalf("content info %s: %v", d, err)
	}
	return true
}

// assertSource checks what a user sees after a CRI pull of ref: the label
// on the tag, repo-digest and ID records, verbose CRI ImageStatus, the
// Pullwise ImageStatus and `pullctl inspecti`.
func (e *env) assertSource(ref string, img registry.Pushed, want string) {
	e.t.Helper()
	repo, _, isDigest := strings.Cut(ref, "@")
	if !isDigest {
		repo, _ = splitRepoTag(ref)
	}
	for _, name := range []string{ref, repo + "@" + img.Digest.String(), img.Config.String()} {
		if got := e.imageLabels("k8s.io", name)[pullSourceLabel]; got != want {
			e.t.Errorf("record %s: %s = %q, want %q", name, pullSourceLabel, got, want)
		}
	}
	st, err := e.images.ImageStatus(context.Background(), criImage(ref), true)
	if err != nil {
		e.t.Fatal(err)
	}
	if got := st.GetInfo()["pullSource"]; got != want {
		e.t.Errorf("CRI verbose ImageStatus pullSource = %q, want %q", got, want)
	}
	pw, err := e.pullwise.ImageStatus(context.Background(), &api.ImageStatusRequest{Image: criImage(ref)})
	if err != nil {
		e.t.Fatal(err)
	}
	if pw.GetPullSource() != want {
		e.t.Errorf("Pullwise ImageStatus pull_source = %q, want %q", pw.GetPullSource(), want)
	}
	out, err := e.pullctl("inspecti", "-o", "json", ref)
	if err != nil {
		e.t.Fatalf("pullctl inspecti: %v\n%s", err, out)
	}
	var v struct {
		Status struct {
			ID         string `json:"id"`
			PullSource string `json:"pullSource"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		e.t.Fatalf("pullctl inspecti -o json: %v\n%s", err, out)
	}
	if v.Status.PullSource != want || v.Status.ID != img.Config.String() {
		e.t.Errorf("pullctl inspecti says %+v, want pullSource %q", v.Status, want)
	}
}

func (e *env) criPull(ref string) {
	e.t.Helper()
	if _, err := e.images.PullImage(context.Background(), criImage(ref), nil, nil); err != nil {
		e.t.Fatalf("PullImage %s: %v", ref, err)
	}
}

func digestRef(host, repo string, img registry.Pushed) string {
	return fmt.Sprintf("%s/%s@%s", host, repo, img.Digest)
}

func blobHosts(t testing.TB, label string) map[string]struct {
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
} {
	var m map[string]struct {
		Blobs int   `json:"blobs"`
		Bytes int64 `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(label), &m); err != nil {
		t.Fatalf("blob sources label %q: %v", label, err)
	}
	return m
}

// TestPullSourceMatrix is KEP-4589's matrix in hosts.toml terms. Each case
// says what the label names and why.
func TestPullSourceMatrix(t *testing.T) {
	const repo = "matrix/app"
	img := registry.Image{Layers: []int64{32 << 10, 32 << 10}, Seed: 800}
	deadMirror := "http://" + freeLoopback(t) // nothing listens there
	for _, tc := range []struct {
		name   string
		mirror string // "", mirrorSeeded
		digest bool
		setup  func(e *env)
		want   func(e *env) string // registry host the label names
	}{
		// No mirror: the upstream serves everything.
		{name: "no mirror, tag", want: func(e *env) string { return e.upstream.Host() }},
		{name: "no mirror, digest", digest: true, want: func(e *env) string { return e.upstream.Host() }},
		// A full mirror resolves and serves.
		{name: "mirror, tag", mirror: mirrorSeeded, want: func(e *env) string { return e.mirror.Host() }},
		{name: "mirror, digest", mirror: mirrorSeeded, digest: true, want: func(e *env) string { return e.mirror.Host() }},
		// A pull-only mirror cannot resolve tags: the upstream resolves
		// the tag (the label names it), the mirror serves the content.
		{name: "pull-only mirror, tag", mirror: mirrorSeeded,
			setup: func(e *env) { e.setMirror(e.mirror.URL(), "pull") },
			want:  func(e *env) string { return e.upstream.Host() }},
		// By digest, pulling is all there is to do: the mirror does it.
		{name: "pull-only mirror, digest", mirror: mirrorSeeded, digest: true,
			setup: func(e *env) { e.setMirror(e.mirror.URL(), "pull") },
			want:  func(e *env) string { return e.mirror.Host() }},
		// A mirror refusing connections is skipped.
		{name: "dead mirror", mirror: mirrorSeeded,
			setup: func(e *env) { e.setMirror(deadMirror, "pull", "resolve") },
			want:  func(e *env) string { return e.upstream.Host() }},
		// A mirror without the image answers 404: the upstream serves.
		{name: "mirror 404", mirror: mirrorSeeded,
			setup: func(e *env) {
				e.mirror.SetFault(registry.When(func(r registry.Request) bool { return r.Kind == registry.KindManifest },
					&registry.Fault{Status: 404}))
			},
			want: func(e *env) string { return e.upstream.Host() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{mirror: tc.mirror})
			pushed := e.push(repo, "v1", img)
			if tc.setup != nil {
				tc.setup(e)
			}
			ref := pushed.Ref
			host := tc.want(e)
			want := host + "/" + repo + ":v1"
			if tc.digest {
				ref = digestRef(e.upstream.Host(), repo, pushed)
				want = host + "/" + repo + "@" + pushed.Digest.String()
			}
			e.criPull(ref)
			e.assertSource(ref, pushed, want)

			// The registry the label names did answer the resolve.
			named := e.upstream
			if e.mirror != nil && host == e.mirror.Host() {
				named = e.mirror
			}
			if err := named.WaitIdle(context.Background()); err != nil {
				t.Fatal(err)
			}
			asked := pushed.Digest.String()
			if !tc.digest {
				asked = "v1"
			}
			if n := named.Count(func(r registry.Request) bool {
				return r.Kind == registry.KindManifest && r.Reference == asked && r.Status == 200
			}); n == 0 {
				t.Errorf("%s named in the label never answered the manifest request for %s", host, asked)
			}

			if tc.name == "pull-only mirror, tag" {
				// Document the split: the mirror served manifest and blobs.
				if err := e.mirror.WaitIdle(context.Background()); err != nil {
					t.Fatal(err)
				}
				if n := e.mirror.Count(func(r registry.Request) bool { return r.Kind == registry.KindBlob && r.Status == 200 }); n != 3 {
					t.Errorf("pull-only mirror served %d blobs, want config and 2 layers", n)
				}
				blobs := blobHosts(t, e.imageLabels("k8s.io", ref)[blobSourceLabel])
				if blobs[e.mirror.Host()].Blobs != 3 || len(blobs) != 1 {
					t.Errorf("blob sources %v, want all 3 from the mirror", blobs)
				}
			}
		})
	}
}

func TestPullSourceSplitBlobs(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded})
	img := e.push("split/app", "v1", registry.Image{Layers: []int64{32 << 10, 48 << 10}, Seed: 810})
	missing := img.Layers[1]
	e.mirror.SetFault(registry.When(func(r registry.Request) bool { return r.Reference == missing.String() },
		&registry.Fault{Status: 404}))
	e.criPull(img.Ref)
	// The mirror resolved the tag and served the manifest: the label names it.
	e.assertSource(img.Ref, img, e.mirror.Host()+"/split/app:v1")
	blobs := blobHosts(t, e.imageLabels("k8s.io", img.Ref)[blobSourceLabel])
	if blobs[e.mirror.Host()].Blobs != 2 || blobs[e.upstream.Host()].Blobs != 1 {
		t.Fatalf("blob sources %v, want 2 from the mirror and the missing layer from upstream", blobs)
	}
	if got := blobs[e.upstream.Host()].Bytes; got != img.LayerSizes[1] {
		t.Fatalf("upstream served %d bytes, want the missing layer's %d", got, img.LayerSizes[1])
	}
	st, err := e.images.ImageStatus(context.Background(), criImage(img.Ref), true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.GetInfo()["pullSourceBlobs"], e.upstream.Host()) {
		t.Fatalf("verbose ImageStatus does not show the split: %v", st.GetInfo())
	}
}

func TestPullSourceFollowsRepullAndRestart(t *testing.T) {
	forEachCRIPullConfig(t, testPullSourceFollowsRepullAndRestart)
}

func testPullSourceFollowsRepullAndRestart(t *testing.T, criImages string) {
	e := newEnv(t, envOptions{criImages: criImages, mirror: mirrorSeeded})
	img := e.push("moving/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 820})
	e.criPull(img.Ref)
	e.assertSource(img.Ref, img, e.mirror.Host()+"/moving/app:v1")

	// An unchanged re-pull fetches nothing but the tag: still the mirror,
	// although the transfer store rewrote the record.
	e.criPull(img.Ref)
	e.assertSource(img.Ref, img, e.mirror.Host()+"/moving/app:v1")

	// The tag moves upstream while the mirror is down.
	moved := e.upstream.Push(t, "moving/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 821})
	e.mirror.SetFault(func(registry.Request) *registry.Fault { return &registry.Fault{Status: 503} })
	e.criPull(img.Ref)
	e.assertSource(img.Ref, moved, e.upstream.Host()+"/moving/app:v1")

	e.d.Restart(t)
	e.assertSource(img.Ref, moved, e.upstream.Host()+"/moving/app:v1")
}

func TestPullSourceCtrPullAndImport(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded})
	img := e.push("ctr/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 830})
	if out, err := e.ctr("k8s.io", "image", "pull", "--plain-http", "--hosts-dir", e.hostsDir, img.Ref); err != nil {
		t.Fatalf("ctr pull: %v\n%s", err, out)
	}
	if got := e.imageLabels("k8s.io", img.Ref)[pullSourceLabel]; got != e.mirror.Host()+"/ctr/app:v1" {
		t.Fatalf("ctr-pulled image labelled %q", got)
	}
	out, err := e.pullctl("images")
	if err != nil || !strings.Contains(out, "PULL SOURCE") || !strings.Contains(out, e.mirror.Host()+"/ctr/app:v1") {
		t.Fatalf("pullctl images (err %v):\n%s", err, out)
	}

	// An image that was never pulled has no source.
	archive := filepath.Join(t.TempDir(), "app.tar")
	if out, err := e.ctr("k8s.io", "images", "export", "--local", archive, img.Ref); err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	if out, err := e.ctr("k8s.io", "images", "rm", img.Ref); err != nil {
		t.Fatalf("rm: %v\n%s", err, out)
	}
	if out, err := e.ctr("k8s.io", "images", "import", "--local", archive); err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	st, err := e.images.ImageStatus(context.Background(), criImage(img.Ref), true)
	if err != nil || st.GetImage() == nil {
		t.Fatalf("imported image status: %v %v", st, err)
	}
	if v, ok := st.GetInfo()["pullSource"]; !ok || v != "" {
		t.Fatalf("imported image pullSource = %q (present %v), want empty", v, ok)
	}
}

func TestPullSourceUnknownNames(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	_, err := e.pullwise.ImageStatus(ctx, &api.ImageStatusRequest{Image: &criapi.ImageSpec{Image: "example.com/nope:1"}})
	if code(err) != "NotFound" || !strings.Contains(err.Error(), "example.com/nope:1") {
		t.Fatalf("unknown image: %v", err)
	}
	_, err = e.pullwise.ContainerStatus(ctx, &api.ContainerStatusRequest{ContainerId: "deadbeef"})
	if code(err) != "NotFound" || !strings.Contains(err.Error(), "deadbeef") {
		t.Fatalf("unknown container: %v", err)
	}
	out, err := e.pullctl("inspecti", "example.com/nope:1")
	if err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("pullctl inspecti of an unknown image (err %v):\n%s", err, out)
	}
	out, err = e.pullctl("inspect", "deadbeef")
	if err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("pullctl inspect of an unknown container (err %v):\n%s", err, out)
	}
}

func splitRepoTag(ref string) (string, string) {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, "latest"
}
