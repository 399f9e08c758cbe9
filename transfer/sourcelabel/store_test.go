package sourcelabel

import (
	"context"
	"maps"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/metadatatest"
)

// TestStoreLabelsWholeWrites: a record containerd writes whole gets the
// context's pull-source labels in that write; a write by field path (a
// label set by CRI or a pin) and a write outside a pull are left as they
// are.
func TestStoreLabelsWholeWrites(t *testing.T) {
	const name = "registry.test/app:v1"
	source := map[string]string{PullSource: "mirror.test/app:v1", BlobSources: ""}
	target := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("m"), Size: 1}
	for _, tc := range []struct {
		name   string
		exists bool // a record of name is there before the write
		labels map[string]string
		write  func(ctx context.Context, s images.Store, img images.Image) error
		want   map[string]string
	}{
		{
			name:   "create",
			labels: source,
			write:  create,
			want:   map[string]string{"own": "1", PullSource: "mirror.test/app:v1"},
		},
		{
			name:   "update whole",
			exists: true,
			labels: source,
			write:  update(),
			want:   map[string]string{"own": "1", PullSource: "mirror.test/app:v1"},
		},
		{
			name:   "update by field path",
			exists: true,
			labels: source,
			write:  update("labels.own"),
			want:   map[string]string{"own": "1", "before": "1"},
		},
		{
			name:  "outside a pull",
			write: create,
			want:  map[string]string{"own": "1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := namespaces.WithNamespace(context.Background(), "test")
			plain := metadata.NewImageStore(metadatatest.DB(t))
			if tc.exists {
				if _, err := plain.Create(ctx, images.Image{Name: name, Target: target, Labels: map[string]string{"before": "1"}}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.labels != nil {
				ctx = WithLabels(ctx, func() map[string]string { return tc.labels })
			}
			own := map[string]string{"own": "1"}
			if err := tc.write(ctx, Store{Store: plain}, images.Image{Name: name, Target: target, Labels: own}); err != nil {
				t.Fatal(err)
			}
			got, err := plain.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got.Labels, tc.want) {
				t.Fatalf("labels %v, want %v", got.Labels, tc.want)
			}
			if len(own) != 1 {
				t.Fatalf("the caller's label map was changed: %v", own)
			}
		})
	}
}

func create(ctx context.Context, s images.Store, img images.Image) error {
	_, err := s.Create(ctx, img)
	return err
}

func update(fieldpaths ...string) func(context.Context, images.Store, images.Image) error {
	return func(ctx context.Context, s images.Store, img images.Image) error {
		_, err := s.Update(ctx, img, fieldpaths...)
		return err
	}
}
