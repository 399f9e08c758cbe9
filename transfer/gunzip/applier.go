package gunzip

import (
	"context"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Applier tells the gzip layers it applies how large their blobs are:
// containerd's applier gives a stream processor the blob's bytes and not
// its descriptor. Knowing the size, a layer read whole is read into one
// buffer, rather than into buffers doubling as it turns out larger, each
// copied into the next and each new memory to fault in; and a layer too
// large to read whole is streamed from its first byte, rather than after
// its first maxBlob bytes were read into memory.
type Applier struct{ diff.Applier }

type sizeKey struct{}

// Apply implements diff.Applier.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	return a.Applier.Apply(context.WithValue(ctx, sizeKey{}, desc.Size), desc, mounts, opts...)
}

// blobSize is the size of the blob ctx's layer was stored as, or 0 when
// not known. It is a hint: a processor before this one (decryption) may
// have changed the stream's length.
func blobSize(ctx context.Context) int64 {
	n, _ := ctx.Value(sizeKey{}).(int64)
	return max(n, 0)
}
