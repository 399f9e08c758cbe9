package transfer

import (
	"context"
	"runtime"
	"testing"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/unpack"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/lendtest"
	"github.com/pullwise/pullwise/transfer/commits"
	"github.com/pullwise/pullwise/transfer/gunzip"
	"github.com/pullwise/pullwise/transfer/lane"
	"github.com/pullwise/pullwise/transfer/lazy"
)

func TestParallelUnpack(t *testing.T) {
	overlay := unpack.Platform{SnapshotterKey: "overlayfs", SnapshotterCapabilities: []string{snapshots.RebaseCap}}
	native := unpack.Platform{SnapshotterKey: "native"}
	for _, tc := range []struct {
		name       string
		configured int
		ups        []unpack.Platform
		want       bool
	}{
		{"upstream's default", 1, []unpack.Platform{overlay}, false},
		{"unset", 0, []unpack.Platform{overlay}, false},
		{"above 1 on overlayfs", 2, []unpack.Platform{overlay}, true},
		{"above 1, no snapshotter can rebase", 4, []unpack.Platform{native}, false},
		{"above 1, one of two can rebase", 2, []unpack.Platform{native, overlay}, true},
		{"no unpacking", 2, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parallelUnpack(tc.configured, tc.ups); got != tc.want {
				t.Errorf("parallelUnpack(%d, %v) = %t, want %t", tc.configured, tc.ups, got, tc.want)
			}
		})
	}
}

// The default turns parallel unpack on wherever there is more than one CPU
// to unpack with, and leaves a one-CPU node as upstream.
func TestDefaultUnpacksInParallelWithMoreThanOneCPU(t *testing.T) {
	c := defaultConfig()
	if c.MaxConcurrentUnpacks != runtime.NumCPU() {
		t.Errorf("default max_concurrent_unpacks = %d, want one per CPU (%d)", c.MaxConcurrentUnpacks, runtime.NumCPU())
	}
	overlay := []unpack.Platform{{SnapshotterCapabilities: []string{snapshots.RebaseCap}}}
	if got, want := parallelUnpack(c.MaxConcurrentUnpacks, overlay), runtime.NumCPU() > 1; got != want {
		t.Errorf("parallel unpack by default on overlayfs with %d CPUs: %t, want %t", runtime.NumCPU(), got, want)
	}
}

// TestEveryPlatformTellsLayersTheirBlobSize: every platform's apply
// options, configured or loaded, give a layer's gzip reader its blob's
// size. Options, not a wrapper: both appliers a platform can end with
// (containerd's, and transfer/implied's in parallel unpack, which applies
// layers itself) pass the options' payloads to the stream processors.
func TestEveryPlatformTellsLayersTheirBlobSize(t *testing.T) {
	shared := make([]diff.ApplyOpt, 1, 4) // room after it: appending must not write there
	shared[0] = diff.WithSyncFs(true)
	configured := []unpack.Platform{{SnapshotterKey: "overlayfs", ApplyOpts: shared}, {SnapshotterKey: "native", ApplyOpts: shared}}
	loaded := []unpack.Platform{{SnapshotterKey: "soci"}}
	u := newUnpacking(defaultConfig(), nil, nil, configured, loaded)
	if len(u.platforms) != 3 {
		t.Fatalf("%d platforms, want 3", len(u.platforms))
	}
	for i, up := range u.platforms {
		var c diff.ApplyConfig
		desc := ocispec.Descriptor{Size: int64(1000 + i)}
		for _, o := range up.ApplyOpts {
			if err := o(context.Background(), desc, &c); err != nil {
				t.Fatal(err)
			}
		}
		if got := gunzip.BlobSizeFrom(c.ProcessorPayloads); got != desc.Size {
			t.Errorf("%s: a layer's processors are told its blob is %d bytes, want %d", up.SnapshotterKey, got, desc.Size)
		}
		if i < len(configured) && !c.SyncFs {
			t.Errorf("%s: the platform's own apply options were lost", up.SnapshotterKey)
		}
	}
	if len(shared) != 1 || shared[:2][1] != nil {
		t.Error("a platform's apply options were appended into a slice the configured platforms share")
	}
}

// TestUnpackerLocksLend: the unpacker's locks on blobs and chain IDs (its
// duplication suppressor) lend a waiting pull's due to the holder's work
// in the lines that work done under them waits in: its layers waiting for
// a place to be written in, and its writes (a blob's commit, a
// snapshot's) waiting for their turn.
func TestUnpackerLocksLend(t *testing.T) {
	turns := commits.New()
	u := newUnpacking(defaultConfig(), nil, turns, []unpack.Platform{{SnapshotterKey: "overlayfs"}}, nil)
	for name, line := range map[string]lendtest.Line{
		"unpack places": lendtest.Lane(u.unpacks, u.layersAtOnce),
		"write turns":   lendtest.ImageWrites(func(s images.Store) images.Store { return commits.Images{Store: s, Turns: turns} }, turns),
	} {
		t.Run(name, func(t *testing.T) { lendtest.HolderGoesFirst(t, u.chains, line, false) })
	}
	// The lane lent to is the one the layers are written through.
	a, ok := u.platforms[0].Applier.(lane.Applier)
	if !ok || a.Lane != u.unpacks {
		t.Fatalf("the platform's applier is %T, not a lane.Applier on the lane the locks lend to", u.platforms[0].Applier)
	}
	// The lane knows which layer a chain's lock is taken for from the
	// snapshots prepared through the platform's snapshotter.
	var guarded lane.Snapshotter
	if l, ok := u.platforms[0].Snapshotter.(lazy.Snapshotter); ok {
		guarded, _ = l.Snapshotter.(lane.Snapshotter)
	}
	if a.Guards == nil || guarded.Guards != a.Guards || guarded.Name != "overlayfs" {
		t.Errorf("the platform's snapshotter (%T) does not tell the applier's lane which chain lock a layer is written under", u.platforms[0].Snapshotter)
	}
	// With small_pulls_first off nothing takes extra places: no layer is
	// known by its lock.
	c := defaultConfig()
	c.SmallPullsFirst = false
	off := newUnpacking(c, nil, turns, []unpack.Platform{{SnapshotterKey: "overlayfs"}}, nil)
	if a, ok := off.platforms[0].Applier.(lane.Applier); !ok || a.Guards != nil {
		t.Errorf("with small_pulls_first off the applier is %#v, want one without Guards", off.platforms[0].Applier)
	}
}
