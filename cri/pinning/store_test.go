package pinning

import (
	"context"
	"maps"
	"testing"

	"github.com/containerd/containerd/v2/core/events/exchange"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/cri/criconfig"

	"github.com/pullwise/pullwise/internal/metadatatest"
)

// testStore is containerd's metadata image store on a bolt DB in a temp
// dir, publishing image events on a real exchange, as in the daemon.
type testStore struct {
	images.Store
	events *exchange.Exchange
}

func newTestStore(t testing.TB) *testStore {
	t.Helper()
	ex := exchange.NewExchange()
	db := metadatatest.DB(t, metadata.WithEventsPublisher(ex))
	return &testStore{Store: metadata.NewImageStore(db), events: ex}
}

// record is an image record to seed; ns defaults to criconfig.Namespace.
type record struct {
	ns     string
	name   string
	target digest.Digest
	labels map[string]string
}

func (s *testStore) create(t testing.TB, r record) {
	t.Helper()
	if _, err := s.Create(nsCtx(r.ns), images.Image{Name: r.name, Target: target(r.target), Labels: maps.Clone(r.labels)}); err != nil {
		t.Fatalf("create %s: %v", r.name, err)
	}
}

// labels returns a record's labels, never nil.
func (s *testStore) labels(t *testing.T, ns, name string) map[string]string {
	t.Helper()
	img, err := s.Get(nsCtx(ns), name)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	if img.Labels == nil {
		return map[string]string{}
	}
	return img.Labels
}

func nsCtx(ns string) context.Context {
	if ns == "" {
		ns = criconfig.Namespace
	}
	return namespaces.WithNamespace(context.Background(), ns)
}

func target(d digest.Digest) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d, Size: 512}
}

// Digests of four manifests and two image configs (image IDs).
var (
	pauseManifest    = digest.FromString("pause 3.10 manifest")
	newPauseManifest = digest.FromString("pause 3.11 manifest")
	appManifest      = digest.FromString("app manifest")
	otherManifest    = digest.FromString("other manifest")
	pauseID          = digest.FromString("pause 3.10 config").String()
	newPauseID       = digest.FromString("pause 3.11 config").String()
)

// Label sets as the reconciler leaves them.
var (
	pinnedByConfig = map[string]string{PinnedLabel: PinnedValue, MarkerLabel: MarkerValue}
	pinnedByHand   = map[string]string{PinnedLabel: PinnedValue}
)

func with(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	maps.Copy(m, b)
	return m
}
