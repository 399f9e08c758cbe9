package lane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/unpack"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/semaphore"

	"github.com/pullwise/pullwise/internal/contenttest"
)

// TestGuardsNameTheUnpackersLocks: containerd's own unpacker, sequential
// and in parallel, applies each layer to mounts that Guards knows by the
// chain lock the unpacker holds for that layer while it applies it. The
// lock's key is containerd's, not Pullwise's: if its form or the
// snapshot's label changed, a lent due would reach no layer.
func TestGuardsNameTheUnpackersLocks(t *testing.T) {
	for _, parallel := range []bool{false, true} {
		t.Run(fmt.Sprintf("parallel=%v", parallel), func(t *testing.T) {
			ctx := t.Context()
			cs := contenttest.NewStore(t)
			manifest, layers, diffIDs := writeImage(t, cs, 3)
			chains := identity.ChainIDs(slices.Clone(diffIDs)) // it writes over its argument

			g := NewGuards()
			locks := &heldKeys{KeyedLock: NewKeyedLock(), held: map[string]bool{}}
			applied := &guardedApplier{locks: locks, guards: g, diffIDs: map[digest.Digest]digest.Digest{}, under: map[digest.Digest]string{}, held: map[digest.Digest]bool{}}
			for i, l := range layers {
				applied.diffIDs[l.Digest] = diffIDs[i]
			}
			p := unpack.Platform{
				Platform:       platforms.All,
				SnapshotterKey: "overlayfs",
				Snapshotter:    Snapshotter{Snapshotter: dirSnapshotter{}, Name: "overlayfs", Guards: g},
				Applier:        applied,
			}
			opts := []unpack.UnpackerOpt{unpack.WithDuplicationSuppressor(locks)}
			if parallel {
				p.SnapshotterCapabilities = []string{"rebase"}
				opts = append(opts, unpack.WithUnpackLimiter(semaphore.NewWeighted(8)))
			}
			u, err := unpack.NewUnpacker(ctx, cs, append(opts, unpack.WithUnpackPlatform(p))...)
			if err != nil {
				t.Fatal(err)
			}
			if err := images.Dispatch(ctx, u.Unpack(images.ChildrenHandler(cs)), nil, manifest); err != nil {
				t.Fatal(err)
			}
			if _, err := u.Wait(); err != nil {
				t.Fatal(err)
			}
			for i, l := range layers {
				want := fmt.Sprintf("sn://overlayfs/%s", chains[i])
				if got := applied.under[l.Digest]; got != want {
					t.Errorf("layer %d applied under %q, want the lock the unpacker holds for it, %q", i, got, want)
				} else if !applied.held[l.Digest] {
					t.Errorf("layer %d applied under %q, which the unpacker did not hold then", i, got)
				}
			}
			if g.len() != 0 {
				t.Errorf("%d snapshots still known after every layer was committed", g.len())
			}
		})
	}
}

// heldKeys is the unpacker's duplication suppressor, saying which keys it
// holds.
type heldKeys struct {
	*KeyedLock
	mu   sync.Mutex
	held map[string]bool
}

func (h *heldKeys) Lock(ctx context.Context, key string) error {
	if err := h.KeyedLock.Lock(ctx, key); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held[key] = true
	return nil
}

func (h *heldKeys) Unlock(key string) {
	h.mu.Lock()
	delete(h.held, key)
	h.mu.Unlock()
	h.KeyedLock.Unlock(key)
}

// guardedApplier records the lock Guards names for each layer it applies,
// and whether the unpacker holds that lock then, and answers with the
// layer's diff ID without writing anything.
type guardedApplier struct {
	locks   *heldKeys
	guards  *Guards
	mu      sync.Mutex
	diffIDs map[digest.Digest]digest.Digest
	under   map[digest.Digest]string
	held    map[digest.Digest]bool
}

func (a *guardedApplier) Apply(_ context.Context, desc ocispec.Descriptor, mounts []mount.Mount, _ ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	key := a.guards.lockOf(mounts)
	a.locks.mu.Lock()
	held := a.locks.held[key]
	a.locks.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.under[desc.Digest], a.held[desc.Digest] = key, held
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: a.diffIDs[desc.Digest]}, nil
}

// writeImage writes an image of n layers to cs and returns its manifest's
// descriptor, its layers and their diff IDs. The layers' bytes are not
// archives: the applier above does not read them.
func writeImage(t *testing.T, cs content.Store, n int) (ocispec.Descriptor, []ocispec.Descriptor, []digest.Digest) {
	t.Helper()
	put := func(mediaType string, b []byte) ocispec.Descriptor {
		desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
		if err := content.WriteBlob(context.Background(), cs, desc.Digest.String(), bytes.NewReader(b), desc); err != nil {
			t.Fatal(err)
		}
		return desc
	}
	var layers []ocispec.Descriptor
	var diffIDs []digest.Digest
	for i := range n {
		layers = append(layers, put(ocispec.MediaTypeImageLayerGzip, fmt.Appendf(nil, "layer %d", i)))
		diffIDs = append(diffIDs, digest.FromString(fmt.Sprintf("uncompressed %d", i)))
	}
	config, err := json.Marshal(ocispec.Image{
		Platform: platforms.DefaultSpec(),
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := json.Marshal(ocispec.Manifest{
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    put(ocispec.MediaTypeImageConfig, config),
		Layers:    layers,
	})
	if err != nil {
		t.Fatal(err)
	}
	return put(ocispec.MediaTypeImageManifest, m), layers, diffIDs
}
