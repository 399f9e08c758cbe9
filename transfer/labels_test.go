package transfer

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/transfer"
	transferimage "github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/transfer/sourcelabel"
)

// TestRepullKeepsSourceInOneWrite: containerd's transfer image store
// rewrites a re-pulled image's record whole, which would wipe its pull
// source. Through sourcelabel.Store, as the plugin wires it, the record
// keeps its source in that one write; through a plain store, the service
// writes the labels back after. Each write is a synced database
// transaction, which in a burst of pulls waits behind every other pull's.
func TestRepullKeepsSourceInOneWrite(t *testing.T) {
	for _, tc := range []struct {
		name       string
		labelling  bool
		wantWrites int64
	}{
		{name: "through sourcelabel.Store", labelling: true, wantWrites: 1},
		{name: "through a plain store", wantWrites: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			manifest, _ := n.hold(t, "registry.test/app:v1")
			// By digest, and not unpacked: a full pull that asks no host,
			// so what it knows of its source is the record's.
			ref := "registry.test/app@" + manifest.Digest.String()
			source := map[string]string{sourcelabel.PullSource: "mirror.test/app@" + manifest.Digest.String()}
			if _, err := n.images.Create(n.ctx, images.Image{Name: ref, Target: manifest, Labels: source}); err != nil {
				t.Fatal(err)
			}
			writes := &writeCounter{Store: n.images}
			var store images.Store = writes
			if tc.labelling {
				store = sourcelabel.Store{Store: writes}
			}
			notUnpacked := func(string) snapshots.Snapshotter { return &statOnly{keys: map[string]bool{}} }
			local := Local{Images: store, Content: n.content, Snapshotter: notUnpacked}
			s, err := New(storingNext{target: manifest, store: store}, local, prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			dst := transferimage.NewStore(ref, transferimage.WithUnpack(platforms.DefaultSpec(), "test"))
			if err := s.Transfer(n.ctx, fakeSource{ref: ref}, dst); err != nil {
				t.Fatal(err)
			}
			got, err := n.images.Get(n.ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			if got.Labels[sourcelabel.PullSource] != source[sourcelabel.PullSource] {
				t.Fatalf("after the re-pull, labels %v, want the pull source kept", got.Labels)
			}
			if w := writes.n.Load(); w != tc.wantWrites {
				t.Fatalf("the re-pull wrote image records %d times, want %d", w, tc.wantWrites)
			}
		})
	}
}

// storingNext stores what it pulls as containerd's local transfer service
// does: through the destination, into store, the image store it was
// built with.
type storingNext struct {
	target ocispec.Descriptor
	store  images.Store
}

func (s storingNext) Transfer(ctx context.Context, _, dst any, _ ...transfer.Opt) error {
	_, err := dst.(transfer.ImageStorer).Store(ctx, s.target, s.store)
	return err
}

// writeCounter counts the writes to image records that changed one (a
// create of a name that exists changes nothing).
type writeCounter struct {
	images.Store
	n atomic.Int64
}

func (w *writeCounter) Create(ctx context.Context, img images.Image) (images.Image, error) {
	return w.count(w.Store.Create(ctx, img))
}

func (w *writeCounter) Update(ctx context.Context, img images.Image, fieldpaths ...string) (images.Image, error) {
	return w.count(w.Store.Update(ctx, img, fieldpaths...))
}

func (w *writeCounter) count(img images.Image, err error) (images.Image, error) {
	if err == nil {
		w.n.Add(1)
	}
	return img, err
}
