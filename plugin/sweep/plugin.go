// Package sweep registers the internal plugin "pullwise-snapshot-sweep":
// at start, before containerd serves a request, it has every snapshotter
// that can clean up (snapshots.Cleaner) remove the directories no snapshot
// record owns.
//
// Why: overlayfs (like native) renames a new snapshot's directory to
// snapshots/<ID> inside the write transaction that records it. A SIGKILL
// between that rename and the commit leaves the directory and rolls the
// record back, so the next snapshot is given the same ID and its rename
// fails with "file exists": the first pull after the crash fails. Upstream
// only runs Cleanup after a garbage collection that removed a snapshot,
// which a restart does not bring about.
package sweep

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
)

func init() {
	registry.Register(&plugin.Registration{
		Type:     plugins.InternalPlugin,
		ID:       "pullwise-snapshot-sweep",
		Requires: []plugin.Type{plugins.SnapshotPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			sweep(ic.Context, ic.Plugins())
			return nil, nil
		},
	})
}

// sweep cleans every snapshotter that loaded. It runs in InitFn, so it is
// done before the gRPC servers start and no Prepare can race it; Cleanup
// itself scans under a write transaction, as the garbage collector relies on.
// Failures are logged, not fatal: the node is then as upstream leaves it.
func sweep(ctx context.Context, set *plugin.Set) {
	// Walk the set rather than GetByType, which fails on the first
	// snapshotter that did not load (btrfs off btrfs, for one).
	for _, p := range set.GetAll() {
		if p.Registration.Type != plugins.SnapshotPlugin {
			continue
		}
		inst, err := p.Instance()
		if err != nil {
			continue
		}
		c, ok := inst.(snapshots.Cleaner)
		if !ok {
			continue
		}
		start := time.Now()
		l := log.G(ctx).WithField("snapshotter", p.Registration.ID)
		err = c.Cleanup(ctx)
		if errdefs.IsNotFound(err) && p.Registration.ID == "overlayfs" {
			// Cleanup cannot list IDs before overlayfs has committed its
			// first snapshot (the bucket is created then), which is just
			// when a crash in that first Prepare leaves snapshots/1.
			err = removeEntries(filepath.Join(p.Meta.Exports[plugins.SnapshotterRootDir], "snapshots"))
		}
		if errdefs.IsNotFound(err) {
			continue
		}
		if err != nil {
			l.WithError(err).Warn("snapshot directories left by a crash were not swept")
			continue
		}
		l.WithField("took", time.Since(start)).Debug("swept snapshot directories no record owns")
	}
}

// removeEntries empties dir, keeping dir itself.
func removeEntries(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove %s: %w", e.Name(), err)
		}
	}
	return nil
}
