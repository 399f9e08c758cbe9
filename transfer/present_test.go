package transfer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	transferimage "github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/internal/metadatatest"
)

// node is what a node holds for these tests: containerd's metadata
// database, and a snapshotter that only says which snapshots exist.
type node struct {
	ctx     context.Context
	images  images.Store
	content content.Store
	sn      *statOnly
}

func newNode(t *testing.T) *node {
	db := metadatatest.DB(t)
	return &node{
		ctx:     namespaces.WithNamespace(context.Background(), "test"),
		images:  metadata.NewImageStore(db),
		content: db.ContentStore(),
		sn:      &statOnly{keys: map[string]bool{}},
	}
}

func (n *node) local(images images.Store) Local {
	return Local{Images: images, Content: n.content, Snapshotter: func(string) snapshots.Snapshotter { return n.sn }}
}

// hold gives the node name's image of one layer, unpacked, as a pull
// leaves it, and returns its manifest and a func that removes it as CRI's
// RemoveImage and containerd's collection do.
func (n *node) hold(t *testing.T, name string) (manifest ocispec.Descriptor, remove func()) {
	t.Helper()
	diffID := digest.FromString("layer")
	config := metadatatest.WriteJSON(t, n.ctx, n.content, ocispec.MediaTypeImageConfig, ocispec.Image{
		Platform: platforms.DefaultSpec(),
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	})
	manifest = metadatatest.WriteJSON(t, n.ctx, n.content, ocispec.MediaTypeImageManifest, ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config,
		Layers:    []ocispec.Descriptor{{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromString("blob"), Size: 4}},
	})
	if _, err := n.images.Create(n.ctx, images.Image{Name: name, Target: manifest}); err != nil {
		t.Fatal(err)
	}
	// With one layer, the chain ID is the layer's diff ID.
	n.sn.add(diffID.String())
	return manifest, func() {
		if err := n.images.Delete(n.ctx, name); err != nil {
			t.Error(err)
		}
		for _, d := range []digest.Digest{manifest.Digest, config.Digest} {
			if err := n.content.Delete(n.ctx, d); err != nil {
				t.Error(err)
			}
		}
		n.sn.remove(diffID.String())
	}
}

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
			n := newNode(t)
			manifest, remove := n.hold(t, "registry.test/app:v1")
			store := &removedFirst{Store: n.images}
			if tc.removed {
				store.remove = remove
			}
			s, err := New(&fakeNext{}, n.local(store), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			ref := "registry.test/app@" + manifest.Digest.String()
			dst := transferimage.NewStore(ref, transferimage.WithUnpack(platforms.DefaultSpec(), "test"))

			_, fast, err := s.fastPath(n.ctx, fakeSource{ref: ref}, dst)
			if err != nil {
				t.Fatal(err)
			}
			if fast != tc.wantFast {
				t.Fatalf("fast path taken: %v, want %v", fast, tc.wantFast)
			}
		})
	}
}

// TestJoinerPullsAgainWhatWasRemoved: a pull stores its image before it
// ends, and a caller may join it in between. If the image was removed
// there, the joiner would be told its image is in when it is not, and CRI
// would answer it NotFound; stock, which does not share pulls, would have
// pulled for it. So the joiner pulls again, and only then, and finds its
// image.
func TestJoinerPullsAgainWhatWasRemoved(t *testing.T) {
	const ref = "registry.test/app:v1"
	for _, tc := range []struct {
		name      string
		removed   bool
		wantPulls int
	}{
		{name: "kept", wantPulls: 1},
		{name: "removed before the pull ended", removed: true, wantPulls: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			next := &fakeNext{release: make(chan struct{}), started: make(chan string, 2)}
			s, err := New(next, n.local(n.images), prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			pull := func() error {
				dst := transferimage.NewStore(ref, transferimage.WithUnpack(platforms.DefaultSpec(), "test"))
				return s.Transfer(n.ctx, fakeSource{ref: ref}, dst)
			}
			errs := make(chan error, 2)
			go func() { errs <- pull() }()
			<-next.started
			go func() { errs <- pull() }()
			await.Until(t, 5*time.Second, "the second caller joined", func() bool { return s.group.Callers() == 2 })

			// What the shared pull stores, and a removal before it ends.
			_, remove := n.hold(t, ref)
			if tc.removed {
				remove()
			}
			next.release <- struct{}{}
			returned, awaitRepull := 0, tc.removed
			for awaitRepull {
				select {
				case <-next.started:
					n.hold(t, ref) // what the joiner's own pull stores
					awaitRepull = false
				case err := <-errs:
					if err != nil {
						t.Fatal(err)
					}
					if returned++; returned == 2 {
						t.Fatal("both callers returned, and the joiner did not pull again")
					}
				}
			}
			// Any further pull returns at once, storing nothing.
			close(next.release)
			for ; returned < 2; returned++ {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if got := next.count(); got != tc.wantPulls {
				t.Fatalf("%d pulls reached the registry, want %d", got, tc.wantPulls)
			}
			if _, err := n.images.Get(n.ctx, ref); err != nil {
				t.Fatalf("after both pulls returned: %v", err)
			}
			if outcome(s, OutcomeDeduped) != float64(2-tc.wantPulls) {
				t.Fatalf("%v pulls counted deduped, want %d", outcome(s, OutcomeDeduped), 2-tc.wantPulls)
			}
		})
	}
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

func (s *statOnly) add(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[key] = true
}

func (s *statOnly) remove(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, key)
}
