package transfer

import (
	"context"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/transfer"
	transferimage "github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/internal/metadatatest"
)

// TestFastPathStoresOnlyWhatIsThere: a pull by digest of an image the
// node holds, unpacked, takes the fast path and stores its name. If the
// image is removed and collected between the check and the store (CRI's
// RemoveImage collects at once), the fast path must not leave a name for
// content that is gone, which CRI would read back as NotFound: the pull
// goes on as a full one.
func TestFastPathStoresOnlyWhatIsThere(t *testing.T) {
	for _, tc := range []struct {
		name     string
		removed  bool
		wantFast bool
	}{
		{name: "present", wantFast: true},
		{name: "removed before the store", removed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := namespaces.WithNamespace(context.Background(), "test")
			db := metadatatest.DB(t)
			cs := db.ContentStore()
			diffID := digest.FromString("layer")
			config := metadatatest.WriteJSON(t, ctx, cs, ocispec.MediaTypeImageConfig, ocispec.Image{
				Platform: platforms.DefaultSpec(),
				RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
			})
			manifest := metadatatest.WriteJSON(t, ctx, cs, ocispec.MediaTypeImageManifest, ocispec.Manifest{
				Versioned: specs.Versioned{SchemaVersion: 2},
				MediaType: ocispec.MediaTypeImageManifest,
				Config:    config,
				Layers:    []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromString("blob"), Size: 4}},
			})
			is := metadata.NewImageStore(db)
			if _, err := is.Create(ctx, images.Image{Name: "registry.test/app:v1", Target: manifest}); err != nil {
				t.Fatal(err)
			}
			// With one layer, the chain ID is the layer's diff ID.
			sn := &statOnly{keys: map[string]bool{diffID.String(): true}}
			store := &removedFirst{Store: is}
			if tc.removed {
				store.remove = func() {
					// What a removal and containerd's collection leave.
					if err := is.Delete(ctx, "registry.test/app:v1"); err != nil {
						t.Error(err)
					}
					for _, d := range []digest.Digest{manifest.Digest, config.Digest} {
						if err := cs.Delete(ctx, d); err != nil {
							t.Error(err)
						}
					}
					sn.remove(diffID.String())
				}
			}
			s, err := New(&fakeNext{}, Local{Images: store, Content: cs, Snapshotter: func(string) snapshots.Snapshotter { return sn }}, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			ref := "registry.test/app@" + manifest.Digest.String()
			dst := transferimage.NewStore(ref, transferimage.WithUnpack(platforms.DefaultSpec(), "test"))

			_, fast, err := s.fastPath(ctx, named{ref}, dst)
			if err != nil {
				t.Fatal(err)
			}
			if fast != tc.wantFast {
				t.Fatalf("fast path taken: %v, want %v", fast, tc.wantFast)
			}
		})
	}
}

// named is a pull source that names its image; the fast path of a digest
// reference asks it nothing else.
type named struct{ ref string }

func (n named) Image() string { return n.ref }
func (n named) Resolve(context.Context) (string, ocispec.Descriptor, error) {
	return "", ocispec.Descriptor{}, errdefs.ErrNotImplemented
}
func (n named) Fetcher(context.Context, string) (transfer.Fetcher, error) {
	return nil, errdefs.ErrNotImplemented
}

// removedFirst is an image store where remove, if set, runs before the
// first image is created: a removal that lands between a check and a
// store.
type removedFirst struct {
	images.Store
	once   sync.Once
	remove func()
}

func (r *removedFirst) Create(ctx context.Context, img images.Image) (images.Image, error) {
	if r.remove != nil {
		r.once.Do(r.remove)
	}
	return r.Store.Create(ctx, img)
}

// statOnly is a snapshotter that knows which snapshots exist, all the
// fast path asks of one.
type statOnly struct {
	snapshots.Snapshotter
	mu   sync.Mutex
	keys map[string]bool
}

func (s *statOnly) Stat(_ context.Context, key string) (snapshots.Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.keys[key] {
		return snapshots.Info{}, errdefs.ErrNotFound
	}
	return snapshots.Info{Name: key}, nil
}

func (s *statOnly) remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, key)
}
