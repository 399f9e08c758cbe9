package cripull

import (
	"context"
	"errors"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// TestRepoDigestAndTag: the names CRI gives a pulled image besides its ID
// (ImageStatus's repoTags and repoDigests), as upstream's
// getRepoDigestAndTag makes them.
func TestRepoDigestAndTag(t *testing.T) {
	target := ocispec.Descriptor{Digest: digest.FromString("manifest")}
	pinned := digest.FromString("pinned")
	for _, tc := range []struct {
		ref        string
		wantDigest string
		wantTag    string
	}{
		{ref: "busybox", wantDigest: "docker.io/library/busybox@" + target.Digest.String(), wantTag: "docker.io/library/busybox:latest"},
		{ref: "registry.example:5000/team/app:v1", wantDigest: "registry.example:5000/team/app@" + target.Digest.String(), wantTag: "registry.example:5000/team/app:v1"},
		{ref: "registry.example/app@" + pinned.String(), wantDigest: "registry.example/app@" + pinned.String()},
		// A tag and a digest: the digest wins, and the tag is dropped
		// when the reference is parsed, as in CRI: no repo tag.
		{ref: "registry.example/app:v1@" + pinned.String(), wantDigest: "registry.example/app@" + pinned.String()},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			named, err := reference.ParseDockerRef(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			d, tag := repoDigestAndTag(named, target)
			if d != tc.wantDigest || tag != tc.wantTag {
				t.Fatalf("repoDigestAndTag(%s) = %q, %q; want %q, %q", tc.ref, d, tag, tc.wantDigest, tc.wantTag)
			}
		})
	}
}

// TestLabels: every image CRI pulls is managed; pinned only when
// pinned_images names it exactly, as upstream compares.
func TestLabels(t *testing.T) {
	p := &Puller{deps: Deps{Config: criconfig.Images{PinnedImages: map[string]string{"sandbox": "registry.k8s.io/pause:3.10"}}}}
	for _, tc := range []struct {
		ref    string
		pinned bool
	}{
		{ref: "registry.k8s.io/pause:3.10", pinned: true},
		{ref: "registry.k8s.io/pause:3.9"},
		{ref: "docker.io/library/busybox:latest"},
	} {
		l := p.labels(tc.ref)
		want := map[string]string{managedLabel: managedValue}
		if tc.pinned {
			want[pinnedLabel] = pinnedValue
		}
		if !maps.Equal(l, want) {
			t.Errorf("labels(%s) = %v, want %v", tc.ref, l, want)
		}
	}
}

// criStore is containerd's metadata image store on a bolt database in a
// temporary directory, in CRI's namespace.
func criStore(t *testing.T) (images.Store, context.Context) {
	t.Helper()
	dir := t.TempDir()
	bdb, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bdb.Close() })
	cs, err := local.NewStore(filepath.Join(dir, "content"))
	if err != nil {
		t.Fatal(err)
	}
	db := metadata.NewDB(bdb, cs, nil)
	if err := db.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return metadata.NewImageStore(db), namespaces.WithNamespace(context.Background(), criconfig.Namespace)
}

// TestCreateOrUpdate: a CRI image record is created with CRI's labels, or
// pointed at the new target with the managed and pinned labels set, and
// every other label (the pull source) left as it was. A pin is never
// taken away by a pull of an image no longer pinned.
func TestCreateOrUpdate(t *testing.T) {
	oldTarget := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("old"), Size: 10}
	newTarget := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("new"), Size: 10}
	managed := map[string]string{managedLabel: managedValue}
	pinned := map[string]string{managedLabel: managedValue, pinnedLabel: pinnedValue}
	source := map[string]string{"io.pullwise.pull-source": "mirror.example/app:v1"}
	with := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			maps.Copy(out, m)
		}
		return out
	}
	for _, tc := range []struct {
		name       string
		existing   *images.Image
		target     ocispec.Descriptor
		labels     map[string]string
		wantLabels map[string]string
	}{
		{name: "new image", target: newTarget, labels: managed, wantLabels: managed},
		{name: "new target keeps the pull source", existing: &images.Image{Target: oldTarget, Labels: with(managed, source)},
			target: newTarget, labels: managed, wantLabels: with(managed, source)},
		{name: "an unmanaged record becomes managed", existing: &images.Image{Target: oldTarget, Labels: source},
			target: oldTarget, labels: managed, wantLabels: with(managed, source)},
		{name: "pinned on its pull", existing: &images.Image{Target: oldTarget, Labels: with(managed, source)},
			target: oldTarget, labels: pinned, wantLabels: with(pinned, source)},
		{name: "a pin stays", existing: &images.Image{Target: oldTarget, Labels: pinned},
			target: newTarget, labels: managed, wantLabels: pinned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, ctx := criStore(t)
			const name = "registry.example/app:v1"
			if tc.existing != nil {
				tc.existing.Name = name
				if _, err := store.Create(ctx, *tc.existing); err != nil {
					t.Fatal(err)
				}
			}
			p := &Puller{deps: Deps{Images: store}}
			if err := p.createOrUpdate(ctx, name, tc.target, tc.labels); err != nil {
				t.Fatal(err)
			}
			got, err := store.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got.Target.Digest != tc.target.Digest || !maps.Equal(got.Labels, tc.wantLabels) {
				t.Fatalf("record: target %s, labels %v; want %s, %v", got.Target.Digest, got.Labels, tc.target.Digest, tc.wantLabels)
			}
		})
	}
}

// failingTransfer answers every transfer with err, and remembers what it
// was asked.
type failingTransfer struct {
	err  error
	asks int
}

func (f *failingTransfer) Transfer(context.Context, any, any, ...transfer.Opt) error {
	f.asks++
	return f.err
}

// TestPullErrors: a reference CRI cannot parse is InvalidArgument before
// any transfer; a transfer that fails comes back in CRI's words, which
// kubelet shows in pod events, with its cause (and its code) kept.
func TestPullErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		image     string
		transfer  error
		wantAsks  int
		wantIs    error
		wantWords string
	}{
		{name: "malformed reference", image: "UPPER/Case:v1", wantIs: errdefs.ErrInvalidArgument, wantWords: `parse image reference "UPPER/Case:v1"`},
		{name: "registry refused", image: "registry.example/app:v1", transfer: errdefs.ErrUnauthenticated, wantAsks: 1,
			wantIs: errdefs.ErrUnauthenticated, wantWords: `failed to pull and unpack image "registry.example/app:v1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &failingTransfer{err: tc.transfer}
			p, err := New(Deps{Transfer: ft, Config: criconfig.Images{Snapshotter: "overlayfs"}})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.PullImage(context.Background(), &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: tc.image}})
			if !errors.Is(err, tc.wantIs) || err == nil || !strings.Contains(err.Error(), tc.wantWords) {
				t.Fatalf("PullImage: %v; want %v saying %q", err, tc.wantIs, tc.wantWords)
			}
			if ft.asks != tc.wantAsks {
				t.Fatalf("%d transfers, want %d", ft.asks, tc.wantAsks)
			}
		})
	}
}
