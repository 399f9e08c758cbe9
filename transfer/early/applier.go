package early

import (
	"context"
	"fmt"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/lane"
)

// Applier applies the layers a pull downloads in the background while
// they arrive, and every other layer as the Applier it wraps does. It
// wraps the lane's, so that a layer waits for its bytes without holding
// an unpack place.
type Applier struct {
	diff.Applier
	Node *Node
	// Reads reports whether the wrapped Applier reads a layer applied to
	// mounts through a Provider (transfer/implied for the layers
	// containerd unpacks in parallel); the others wait for their blob.
	Reads func(mounts []mount.Mount) bool
}

// Apply implements diff.Applier.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	arr := pullOf(ctx).arrival(desc.Digest)
	if arr == nil {
		return a.Applier.Apply(ctx, desc, mounts, opts...)
	}
	asked := time.Now()
	stream := a.Reads != nil && a.Reads(mounts)
	var err error
	if stream {
		stream, err = arr.ready(ctx, a.Node.Cost)
	} else {
		err = arr.wait(ctx)
	}
	if err == nil && stream && a.Node.Yield != nil {
		// Written early, the layer would take CPUs and the disk from
		// pulls due before it, which it would otherwise leave to them;
		// its write can wait for them at no cost to anyone, without a
		// place. Once written, the lane's Pacer has it give way to them
		// (lane.WrittenEarly).
		err = a.Node.Yield(ctx)
	}
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("download %s: %w", desc.Digest, err)
	}
	if !stream {
		return a.Applier.Apply(ctx, desc, mounts, opts...)
	}
	started := time.Now()
	applied, err := a.Applier.Apply(a.withStream(ctx, arr), desc, mounts, opts...)
	if err != nil {
		// The pull fails: its download has nothing left to feed.
		arr.cancel()
		return ocispec.Descriptor{}, err
	}
	// Written to its end, the blob may still be short of its commit,
	// where its digest is checked.
	if err := arr.wait(ctx); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("download %s: %w", desc.Digest, err)
	}
	log.G(ctx).WithFields(log.Fields{
		"layer":   desc.Digest,
		"waited":  started.Sub(asked),
		"starved": arr.Starved(),
		"done":    time.Since(started),
	}).Debug("layer written while it arrived")
	return applied, nil
}

type streamKey struct{}

// withStream has a Provider read arr's blob as it arrives, and tells the
// lane that the layer is written early: it gives way to pulls ahead all
// along, not only at its start, since pulls come through the gate one
// after another and its start may fall between two; and what it waited
// for bytes is not what writing it cost.
func (a Applier) withStream(ctx context.Context, arr *arrival) context.Context {
	return lane.WrittenEarly(context.WithValue(ctx, streamKey{}, arr), arr.Starved)
}

// Provider reads the blob of a layer written while it arrives from its
// arrival, and any other from the Provider it wraps.
type Provider struct {
	content.Provider
}

// ReaderAt implements content.Provider.
func (p Provider) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	if arr, ok := ctx.Value(streamKey{}).(*arrival); ok && arr.desc.Digest == desc.Digest {
		return &reader{a: arr, ctx: ctx}, nil
	}
	return p.Provider.ReaderAt(ctx, desc)
}
