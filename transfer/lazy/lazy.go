// Package lazy tells a pull which of its layers a remote snapshotter
// (stargz, SOCI, nydus) mounted lazily. containerd's unpacker asks the
// snapshotter to prepare each layer's snapshot with the layer's labels;
// a remote snapshotter that can serve the layer from the registry on
// demand answers AlreadyExists, and the unpacker then neither fetches nor
// applies the layer. Nothing else marks that moment: the layer gets no
// progress event, no download and no apply, so a pull's progress and its
// slot would wait for a layer that never comes.
package lazy

import (
	"context"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
)

// layerDigestLabel is the layer's digest, which containerd's unpacker
// gives a layer's snapshot from snapshot annotations (CRI's, or the
// unpacker's for a snapshotter exporting
// enable_remote_snapshot_annotations). Remote snapshotters need it to find
// the layer, so a lazy layer always has it. Beside it,
// snapshots.LabelSnapshotRef names the snapshot the Prepare should commit
// to; a remote snapshotter answers AlreadyExists once that snapshot exists.
const layerDigestLabel = "containerd.io/snapshot/cri.layer-digest"

// Observer learns of each layer mounted lazily.
type Observer func(layer digest.Digest)

type observerKey struct{}

// WithObserver returns ctx carrying o, for the Prepare calls the pull's
// unpacker makes with a context derived from it.
func WithObserver(ctx context.Context, o Observer) context.Context {
	return context.WithValue(ctx, observerKey{}, o)
}

// Snapshotter reports to the pull's Observer each layer it mounted lazily.
type Snapshotter struct {
	snapshots.Snapshotter
}

// Prepare passes through; an AlreadyExists answer to a Prepare that names
// a target snapshot is a layer the snapshotter mounted itself.
func (s Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	m, err := s.Snapshotter.Prepare(ctx, key, parent, opts...)
	if errdefs.IsAlreadyExists(err) {
		if o, ok := ctx.Value(observerKey{}).(Observer); ok {
			if d, ok := layerOf(opts); ok {
				o(d)
			}
		}
	}
	return m, err
}

// layerOf returns the layer digest of a Prepare aimed at a target
// snapshot.
func layerOf(opts []snapshots.Opt) (digest.Digest, bool) {
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return "", false
		}
	}
	if info.Labels[snapshots.LabelSnapshotRef] == "" {
		return "", false
	}
	d, err := digest.Parse(info.Labels[layerDigestLabel])
	return d, err == nil
}
