package pullsource

import (
	"context"
	"maps"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/internal/metadatatest"
	"github.com/pullwise/pullwise/transfer/aliases"
	"github.com/pullwise/pullwise/transfer/sourcelabel"
)

// TestPullMakesCRIsNames: a CRI pull, through the interceptor, stores the
// image's record with the records CRI names it by after the pull, its ID
// (the config of the node's platform) and its repo digest, labelled as
// the record is; a record the pull does not name gets none.
func TestPullMakesCRIsNames(t *testing.T) {
	ctx := namespaces.WithNamespace(context.Background(), criconfig.Namespace)
	db := metadatatest.DB(t)
	cs := db.ContentStore()
	here := platforms.DefaultSpec()
	other := ocispec.Platform{OS: "linux", Architecture: "s390x"}
	if here.Architecture == other.Architecture {
		other.Architecture = "riscv64"
	}
	manifest := func(p ocispec.Platform) ocispec.Descriptor {
		config := metadatatest.WriteJSON(t, ctx, cs, ocispec.MediaTypeImageConfig, ocispec.Image{Platform: p})
		m := metadatatest.WriteJSON(t, ctx, cs, ocispec.MediaTypeImageManifest, ocispec.Manifest{
			MediaType: ocispec.MediaTypeImageManifest, Config: config, Layers: []ocispec.Descriptor{},
		})
		m.Platform = &p
		return m
	}
	hereManifest, otherManifest := manifest(here), manifest(other)
	index := metadatatest.WriteJSON(t, ctx, cs, ocispec.MediaTypeImageIndex, ocispec.Index{
		MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{otherManifest, hereManifest},
	})
	hereConfig, err := images.Config(ctx, cs, hereManifest, platforms.All)
	if err != nil {
		t.Fatal(err)
	}
	id := hereConfig.Digest.String()
	labels := map[string]string{"io.cri-containerd.image": "managed", sourcelabel.PullSource: "mirror.test/app:v1"}

	for _, tc := range []struct {
		name   string
		ref    string   // the pull's
		stored string   // the record the pull stores
		want   []string // records there after
		absent []string
	}{
		{
			name: "by tag", ref: "registry.test/app:v1", stored: "registry.test/app:v1",
			want: []string{"registry.test/app:v1", id, "registry.test/app@" + index.Digest.String()},
		},
		{
			name: "by digest", ref: "registry.test/app@" + index.Digest.String(), stored: "registry.test/app@" + index.Digest.String(),
			want: []string{"registry.test/app@" + index.Digest.String(), id},
		},
		{
			name: "a record the pull does not name", ref: "registry.test/app:v1", stored: "registry.test/other:v1",
			want: []string{"registry.test/other:v1"}, absent: []string{id, "registry.test/other@" + index.Digest.String()},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The content is the first database's; the records go in a
			// database of their own per case.
			recs := metadatatest.DB(t)
			plain := metadata.NewImageStore(recs)
			s := New(plain, cs)
			// CRI's pull, as far as the records: the transfer service
			// stores the one it names, through the store the daemon's is.
			pull := func(ctx context.Context, req any) (any, error) {
				_, err := aliases.Store{Store: plain, DB: recs}.Create(ctx, images.Image{Name: tc.stored, Target: index, Labels: maps.Clone(labels)})
				return &runtime.PullImageResponse{ImageRef: id}, err
			}
			req := &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: tc.ref}}
			if _, err := s.UnaryServerInterceptor()(ctx, req, &grpc.UnaryServerInfo{FullMethod: methodPullImage}, pull); err != nil {
				t.Fatal(err)
			}
			for _, n := range tc.want {
				got, err := plain.Get(ctx, n)
				if err != nil {
					t.Errorf("record %s: %v", n, err)
					continue
				}
				if got.Target.Digest != index.Digest || !maps.Equal(got.Labels, labels) {
					t.Errorf("record %s: %s %v, want %s %v", n, got.Target.Digest, got.Labels, index.Digest, labels)
				}
			}
			for _, n := range tc.absent {
				if _, err := plain.Get(ctx, n); !errdefs.IsNotFound(err) {
					t.Errorf("record %s: %v, want none", n, err)
				}
			}
		})
	}
}

// TestRepoDigestAndTag: the names CRI gives a pulled image besides its ID
// (ImageStatus's repoTags and repoDigests), as upstream's
// GetRepoDigestAndTag makes them from the normalized reference and the
// pulled target's digest (v2.4.2 looks only at the digest: containerd 1.x
// gave schema1 images no repo digest).
func TestRepoDigestAndTag(t *testing.T) {
	target := digest.FromString("manifest")
	pinned := digest.FromString("pinned")
	for _, tc := range []struct {
		name       string
		ref        string
		wantDigest string
		wantTag    string
	}{
		{name: "docker.io short name gets library/ and latest", ref: "busybox",
			wantDigest: "docker.io/library/busybox@" + target.String(), wantTag: "docker.io/library/busybox:latest"},
		{name: "docker.io short name with a tag", ref: "busybox:1.36",
			wantDigest: "docker.io/library/busybox@" + target.String(), wantTag: "docker.io/library/busybox:1.36"},
		{name: "docker.io user repository", ref: "alice/app:v2",
			wantDigest: "docker.io/alice/app@" + target.String(), wantTag: "docker.io/alice/app:v2"},
		{name: "docker.io short name by digest", ref: "busybox@" + pinned.String(),
			wantDigest: "docker.io/library/busybox@" + pinned.String()},
		{name: "registry with a port, tagged", ref: "registry.example:5000/team/app:v1",
			wantDigest: "registry.example:5000/team/app@" + target.String(), wantTag: "registry.example:5000/team/app:v1"},
		// By digest, the repo digest is the one asked for, not the
		// target's, and there is no repo tag.
		{name: "by digest", ref: "registry.example/app@" + pinned.String(),
			wantDigest: "registry.example/app@" + pinned.String()},
		// A tag and a digest: the digest wins, and the tag is dropped
		// when the reference is parsed, as in CRI: no repo tag.
		{name: "tag and digest", ref: "registry.example/app:v1@" + pinned.String(),
			wantDigest: "registry.example/app@" + pinned.String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			named, err := reference.ParseDockerRef(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			d, tag := RepoDigestAndTag(named, target)
			if d != tc.wantDigest || tag != tc.wantTag {
				t.Errorf("RepoDigestAndTag(%s) = %q, %q; want %q, %q", tc.ref, d, tag, tc.wantDigest, tc.wantTag)
			}
		})
	}
}
