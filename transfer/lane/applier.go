package lane

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Applier applies layers through a lane. containerd's unpacker calls Apply
// once a layer's download is done, so a place is held only while the
// layer is being written, never while it is still on the network.
type Applier struct {
	diff.Applier
	Lane *Lane
	// Waited reports whether other work waits for something the pull
	// with ticket t holds, such as the lock on a layer shared with other
	// images; such a pull's layers are not paced, lest the work it holds
	// up wait on the pause too. Nil: nothing is held.
	Waited func(t *Ticket) bool
}

// Apply implements diff.Applier. The layer's reader may be paced
// (PacerOf), for the pulls due well before it.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	asked := time.Now()
	h, err := a.Lane.acquire(ctx)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("wait to unpack %s: %w", desc.Digest, err)
	}
	defer a.Lane.releaser(h)()
	waited := time.Since(asked)
	ctx, pacer := withPacer(ctx, a.Lane, h, a.Waited)
	applied, err := a.Applier.Apply(ctx, desc, mounts, opts...)
	log.G(ctx).WithFields(log.Fields{
		"layer":  desc.Digest,
		"waited": waited,
		"paused": pacer.Paused(),
		"took":   time.Since(asked),
	}).Debug("layer unpacked in its lane")
	return applied, err
}
