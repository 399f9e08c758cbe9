package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/source"
)

// Local is what the node already has: the stores a fast path checks before
// a pull goes to the registry.
type Local struct {
	Images      images.Store
	Content     content.Store
	Snapshotter func(name string) snapshots.Snapshotter
}

// localTarget returns the target the node holds for ref: for a digest
// reference, any image with that target; for a tag, the image of that name.
func (l Local) localTarget(ctx context.Context, ref string) (ocispec.Descriptor, bool, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return ocispec.Descriptor{}, false, nil
	}
	if d, ok := named.(reference.Digested); ok {
		imgs, err := l.Images.List(ctx, "target.digest=="+d.Digest().String())
		if err != nil || len(imgs) == 0 {
			return ocispec.Descriptor{}, false, err
		}
		return imgs[0].Target, true, nil
	}
	for _, name := range []string{ref, named.String()} {
		img, err := l.Images.Get(ctx, name)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return ocispec.Descriptor{}, false, err
		}
		return img.Target, true, nil
	}
	return ocispec.Descriptor{}, false, nil
}

// unpacked reports whether target is unpacked for every platform and
// snapshotter the destination asks for: the chain ID snapshot of each
// exists. Content missing for a platform means not unpacked.
func (l Local) unpacked(ctx context.Context, target ocispec.Descriptor, unpacks []transfer.UnpackConfiguration) (bool, error) {
	if len(unpacks) == 0 {
		return false, nil
	}
	for _, u := range unpacks {
		sn := l.Snapshotter(u.Snapshotter)
		if sn == nil {
			return false, nil
		}
		chainID, err := l.chainID(ctx, target, u.Platform)
		if errors.Is(err, errdefs.ErrNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if _, err := sn.Stat(ctx, chainID.String()); errors.Is(err, errdefs.ErrNotFound) {
			return false, nil
		} else if err != nil {
			return false, fmt.Errorf("stat snapshot %s: %w", chainID, err)
		}
	}
	return true, nil
}

func (l Local) chainID(ctx context.Context, target ocispec.Descriptor, p ocispec.Platform) (digest.Digest, error) {
	m, err := images.Manifest(ctx, l.Content, target, platforms.Only(p))
	if err != nil {
		return "", fmt.Errorf("manifest for %s: %w", platforms.Format(p), err)
	}
	diffIDs, err := images.RootFS(ctx, l.Content, m.Config)
	if err != nil {
		return "", fmt.Errorf("rootfs of %s: %w", m.Config.Digest, err)
	}
	return identity.ChainID(diffIDs), nil
}

// present returns whether a blob is committed in the content store.
func (l Local) present(ctx context.Context) func(digest.Digest) bool {
	return func(d digest.Digest) bool {
		if l.Content == nil {
			return false
		}
		_, err := l.Content.Info(ctx, d)
		return err == nil
	}
}

// snapshotted counts the leading layers of an image whose chain of
// snapshots exists in the snapshotter u unpacks into, as containerd's
// unpacker checks before it fetches a layer. It needs the image's config
// in the content store for the layers' diff IDs: until then it does not
// know.
func (l Local) snapshotted(ctx context.Context, u transfer.UnpackConfiguration) source.Unpacked {
	return func(config digest.Digest, layers []ocispec.Descriptor) (int, bool) {
		sn := l.Snapshotter(u.Snapshotter)
		if sn == nil || l.Content == nil {
			return 0, true
		}
		info, err := l.Content.Info(ctx, config)
		if err != nil {
			return 0, false
		}
		diffIDs, err := images.RootFS(ctx, l.Content, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: config, Size: info.Size})
		if err != nil {
			return 0, false
		}
		if len(diffIDs) != len(layers) {
			return 0, true
		}
		for i, chainID := range identity.ChainIDs(diffIDs) {
			if _, err := sn.Stat(ctx, chainID.String()); err != nil {
				return i, true
			}
		}
		return len(layers), true
	}
}
