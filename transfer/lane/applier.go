package lane

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Applier applies layers through a lane. containerd's unpacker calls Apply
// once a layer's download is done, so a place is held only while the
// layer is being written, never while it is still on the network.
type Applier struct {
	diff.Applier
	Lane *Lane
}

// Apply implements diff.Applier.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	release, err := a.Lane.Acquire(ctx)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("wait to unpack %s: %w", desc.Digest, err)
	}
	defer release()
	return a.Applier.Apply(ctx, desc, mounts, opts...)
}
