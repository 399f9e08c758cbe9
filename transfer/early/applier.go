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
		// its write can wait for them at no cost to anyone.
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
		"yielded": arr.Yielded(),
		"done":    time.Since(started),
	}).Debug("layer written while it arrived")
	return applied, nil
}

type streamKey struct{}

// stream is a layer's blob as it arrives, and what its reads wait for.
type stream struct {
	arr *arrival
	// yield waits while pulls due before the layer's are in flight: the
	// write gives way to them all along, not only at its start, since
	// pulls come through the gate one after another and its start may
	// fall between two.
	yield func() error
}

// withStream has a Provider read arr's blob as it arrives, and tells the
// lane's Applier how long that waited for bytes or for pulls ahead, which
// is not what writing the layer cost.
func (a Applier) withStream(ctx context.Context, arr *arrival) context.Context {
	s := stream{arr: arr}
	if a.Node.Yield != nil {
		s.yield = func() error { return a.Node.Yield(ctx) }
	}
	idle := func() time.Duration { return arr.Starved() + arr.Yielded() }
	return lane.WithStarved(context.WithValue(ctx, streamKey{}, s), idle)
}

// Provider reads the blob of a layer written while it arrives from its
// arrival, and any other from the Provider it wraps.
type Provider struct {
	content.Provider
}

// ReaderAt implements content.Provider.
func (p Provider) ReaderAt(ctx context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	if s, ok := ctx.Value(streamKey{}).(stream); ok && s.arr.desc.Digest == desc.Digest {
		return &reader{a: s.arr, ctx: ctx, yield: s.yield}, nil
	}
	return p.Provider.ReaderAt(ctx, desc)
}
