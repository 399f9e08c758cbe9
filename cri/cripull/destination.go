package cripull

import (
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/transfer"
	transferimage "github.com/containerd/containerd/v2/core/transfer/image"
	snpkg "github.com/containerd/containerd/v2/pkg/snapshotters"
	"github.com/containerd/platforms"
)

// destination is the transfer image store CRI's transfer path builds, with
// the two options of CRI's local path that change what a pull writes:
// layers that GC may collect once unpacked (discard_unpacked_layers), and
// snapshot labels for remote snapshotters (snapshot annotations). Both act
// on the children a manifest lists, which is where the transfer service
// lets a destination hook in (transfer.ImageFilterer).
type destination struct {
	*imageStore
	ref         string
	discard     bool
	annotations bool
}

// imageStore is embedded under this name, not as Store: a field named
// Store would hide the store's Store method, and with it ImageStorer.
type imageStore = transferimage.Store

// ImageFilter implements transfer.ImageFilterer.
func (d destination) ImageFilter(h images.HandlerFunc, cs content.Store) images.HandlerFunc {
	if d.discard {
		// The store's own filter labels a manifest with GC references to
		// all its children; its label map is not settable from outside.
		// For the one platform CRI pulls, this is the same filter with
		// containerd's map that leaves layers out, as client.Pull's
		// WithChildLabelMap(ChildGCLabelsFilterLayers) does.
		h = images.SetChildrenMappedLabels(cs, h, images.ChildGCLabelsFilterLayers)
		h = images.FilterPlatforms(h, platforms.Ordered(platforms.DefaultSpec()))
	} else {
		h = d.imageStore.ImageFilter(h, cs)
	}
	if d.annotations {
		h = images.HandlerFunc(snpkg.AppendInfoHandlerWrapper(d.ref)(h).Handle)
	}
	return h
}

// The transfer service finds what a destination can do by interface.
var (
	_ transfer.ImageStorer   = destination{}
	_ transfer.ImageUnpacker = destination{}
	_ transfer.ImageFilterer = destination{}
	_ transfer.ImageLookup   = destination{}
)
