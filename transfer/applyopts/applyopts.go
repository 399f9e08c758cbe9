// Package applyopts carries a pull's own layer apply options, such as
// CRI's image_pull_with_sync_fs and its node key model for encrypted
// images, to the layers the pull applies. containerd's transfer service
// takes apply options only per unpack platform, fixed at start, while
// these belong to CRI's pulls alone; the pull's context reaches the
// applier, so they ride there.
package applyopts

import (
	"context"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

type key struct{}

// With adds opts to the options every layer of ctx's pull is applied with.
func With(ctx context.Context, opts ...diff.ApplyOpt) context.Context {
	if len(opts) == 0 {
		return ctx
	}
	all := append(append([]diff.ApplyOpt{}, From(ctx)...), opts...)
	return context.WithValue(ctx, key{}, all)
}

// From returns the options With gave ctx.
func From(ctx context.Context) []diff.ApplyOpt {
	opts, _ := ctx.Value(key{}).([]diff.ApplyOpt)
	return opts
}

// Applier applies each layer with its pull's options after the caller's.
type Applier struct {
	diff.Applier
}

// Apply implements diff.Applier.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	if extra := From(ctx); len(extra) > 0 {
		opts = append(append([]diff.ApplyOpt{}, opts...), extra...)
	}
	return a.Applier.Apply(ctx, desc, mounts, opts...)
}
