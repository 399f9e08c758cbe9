package space

import (
	"context"
	"sync"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// DefaultRatio is the unpacked size of a compressed byte until the node
// has unpacked a layer: gzip'd filesystem layers typically inflate two to
// three times, and the lower end admits more pulls at once while the
// ledger still keeps them from all failing together.
const DefaultRatio = 2.0

// ratioWindow is how many compressed bytes the learned ratio weighs before
// older layers count half: the node's recent images, not its first ones.
const ratioWindow = 8 << 30

// Ratio learns, from the layers the node unpacks, how many bytes of files
// a compressed byte becomes. The zero value is ready.
type Ratio struct {
	mu                   sync.Mutex
	compressed, unpacked float64
}

// Observe adds one unpacked layer.
func (r *Ratio) Observe(compressed, unpacked int64) {
	if compressed <= 0 || unpacked <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.compressed += float64(compressed)
	r.unpacked += float64(unpacked)
	if r.compressed > ratioWindow {
		r.compressed, r.unpacked = r.compressed/2, r.unpacked/2
	}
}

// Value is the ratio learned so far, or DefaultRatio.
func (r *Ratio) Value() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.compressed == 0 {
		return DefaultRatio
	}
	return r.unpacked / r.compressed
}

// Applier teaches Ratio every layer it applies: the applied descriptor's
// size is the layer's uncompressed tar.
type Applier struct {
	diff.Applier
	Ratio *Ratio
}

// Apply passes through and observes.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	out, err := a.Applier.Apply(ctx, desc, mounts, opts...)
	if err == nil {
		a.Ratio.Observe(desc.Size, out.Size)
	}
	return out, err
}
