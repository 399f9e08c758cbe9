package keep

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/metadatatest"
)

func blob(s string, size int64) ocispec.Descriptor {
	return ocispec.Descriptor{Digest: digest.FromString(s), Size: size}
}

// TestKeep: each pull's blobs get a lease that names them and expires;
// beyond the budget the oldest pulls' leases go, and a pull larger than
// the whole budget is not kept.
func TestKeep(t *testing.T) {
	lm := metadata.NewLeaseManager(metadatatest.DB(t))
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")
	k := New(lm, time.Hour, 100)

	pulls := [][]ocispec.Descriptor{
		{blob("a-config", 10), blob("a-layer", 30)},
		{blob("b-config", 10), blob("b-layer", 40)},
		{blob("c-layer", 30)}, // 120 in all: a goes
		{blob("huge", 101)},   // beyond the budget by itself: not kept
	}
	for _, p := range pulls {
		if err := k.Keep(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	ls, err := lm.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var held []digest.Digest
	for _, l := range ls {
		if l.Labels[Label] != "true" || l.Labels["containerd.io/gc.expire"] == "" {
			t.Errorf("lease %s labels %v: want %s and an expiry", l.ID, l.Labels, Label)
		}
		rs, err := lm.ListResources(ctx, l)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			held = append(held, digest.Digest(r.ID))
		}
	}
	want := []digest.Digest{blob("b-config", 0).Digest, blob("b-layer", 0).Digest, blob("c-layer", 0).Digest}
	slices.Sort(held)
	slices.Sort(want)
	if len(ls) != 2 || !slices.Equal(held, want) {
		t.Fatalf("%d leases holding %v, want 2 holding b's and c's blobs %v", len(ls), held, want)
	}
	if k.Bytes() != 80 {
		t.Fatalf("books say %d bytes kept, want 80", k.Bytes())
	}
}
