package transfer

import (
	"context"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
)

// offer tells the node's peers the blobs of the images a pull stored,
// which the node can serve them now (transfer/peers); it never waits on
// them. Blobs the pull did not keep (discard_unpacked_layers) are not
// announced: the peers check the content store first.
func (s *Service) offer(ctx context.Context, dst transfer.ImageStorer) {
	node := s.config.Load().Peers
	l, ok := dst.(transfer.ImageLookup)
	if node == nil || !ok || s.local.Images == nil || s.local.Content == nil {
		return
	}
	recs, err := l.Lookup(ctx, s.local.Images)
	if err != nil {
		log.G(ctx).WithError(err).Debug("peers: look up the images pulled")
		return
	}
	match := platforms.Default()
	if u, ok := dst.(transfer.ImageUnpacker); ok && len(u.UnpackPlatforms()) == 1 {
		match = platforms.Only(u.UnpackPlatforms()[0].Platform)
	}
	for _, rec := range recs {
		m, err := images.Manifest(ctx, s.local.Content, rec.Target, match)
		if err != nil {
			log.G(ctx).WithError(err).WithField("image", rec.Name).Debug("peers: no manifest to offer")
			continue
		}
		blobs := []digest.Digest{m.Config.Digest}
		for _, l := range m.Layers {
			blobs = append(blobs, l.Digest)
		}
		node.Offer(blobs...)
	}
}
