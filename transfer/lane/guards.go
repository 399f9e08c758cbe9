package lane

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"

	"github.com/pullwise/pullwise/transfer/layerdir"
)

// Guards knows, for each layer containerd's unpacker writes, the lock it
// took on the layer's chain before preparing the layer's snapshot: the
// lock an image sharing that chain waits on (KeyedLock), and whose lent
// due is the layer's (Ticket.OwnDueUnder). The unpacker gives the applier
// the snapshot's mounts only, so a layer is known by the directory they
// write to, from the Prepare that returned them (Snapshotter) to the
// snapshot's commit or removal.
// Layers written to other snapshotters' mounts (btrfs, devmapper, remote
// ones; layerdir.Of) are known by no lock, and go by their pull's
// due as before.
type Guards struct {
	mu        sync.Mutex
	lockByDir map[string]string // directory written → lock key
	dirByKey  map[string]string // snapshot key → directory written
}

// NewGuards returns an empty Guards.
func NewGuards() *Guards {
	return &Guards{lockByDir: map[string]string{}, dirByKey: map[string]string{}}
}

// lockOf is the lock the layer written to mounts is done under, or "". A
// nil Guards knows none.
func (g *Guards) lockOf(mounts []mount.Mount) string {
	if g == nil {
		return ""
	}
	dir, ok := layerdir.Of(mounts)
	if !ok {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lockByDir[dir]
}

func (g *Guards) put(key, dir, lock string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dirByKey[key] = dir
	g.lockByDir[dir] = lock
}

func (g *Guards) forget(key string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if dir, ok := g.dirByKey[key]; ok {
		delete(g.dirByKey, key)
		delete(g.lockByDir, dir)
	}
}

// Snapshotter records in Guards (nil: nowhere) the chain lock of each
// layer snapshot containerd's unpacker prepares.
type Snapshotter struct {
	snapshots.Snapshotter
	// Name is the snapshotter's name, which the unpacker's chain locks
	// carry.
	Name   string
	Guards *Guards
}

// Prepare implements snapshots.Snapshotter. The unpacker labels a layer's
// snapshot with the layer's chain ID (snapshots.LabelSnapshotRef), under
// whose lock it prepares it.
func (s Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := s.Snapshotter.Prepare(ctx, key, parent, opts...)
	if err != nil || !strings.HasPrefix(key, snapshots.UnpackKeyPrefix) {
		return m, err
	}
	var info snapshots.Info
	for _, o := range opts {
		if o(&info) != nil {
			// The snapshot is prepared; a layer not known by its
			// lock only keeps its pull's due.
			return m, nil
		}
	}
	if chain := info.Labels[snapshots.LabelSnapshotRef]; chain != "" {
		if dir, ok := layerdir.Of(m); ok {
			s.Guards.put(key, dir, chainLock(s.Name, chain))
		}
	}
	return m, nil
}

// Commit implements snapshots.Snapshotter.
func (s Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	defer s.Guards.forget(key)
	return s.Snapshotter.Commit(ctx, name, key, opts...)
}

// Remove implements snapshots.Snapshotter.
func (s Snapshotter) Remove(ctx context.Context, key string) error {
	defer s.Guards.forget(key)
	return s.Snapshotter.Remove(ctx, key)
}

// chainLock is the key containerd's unpacker locks a chain ID under, in a
// snapshotter (core/unpack's makeChainIDKeyWithSnapshotter, unexported:
// TestGuardsNameTheUnpackersLocks fails if its form drifts).
func chainLock(snapshotter, chainID string) string {
	return fmt.Sprintf("sn://%s/%s", snapshotter, chainID)
}
