package transfer

import (
	"runtime"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/unpack"
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
