package transfer

import (
	"context"

	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/source"
)

// prefetch learns the size of a pull that waits for a slot, while it
// waits: it resolves the reference and fetches the image manifest, and
// moves the pull's ticket, which the gate serves in order, to when the
// pull would be done. The pull that started it owns it and waits for its
// end (wait), whether it runs or gives up.
type prefetch struct {
	cancel context.CancelFunc
	done   chan struct{}
	desc   ocispec.Descriptor   // once done: the reference's, if resolved (even when err says the manifest was not fetched)
	layers []ocispec.Descriptor // once done without err: the layers the pull will fetch
	err    error
}

// startPrefetch prefetches for the pull p of rec into dst, which unpacks
// one platform. resolved is the reference's descriptor when the fast path
// resolved it already, else nil. The layers the pull has to fetch go to
// need, which places its ticket, and their bytes to ListPulls.
func (s *Service) startPrefetch(ctx context.Context, p *pull, rec *source.Fetcher, dst transfer.ImageStorer, resolved *ocispec.Descriptor, need func(layers []ocispec.Descriptor)) *prefetch {
	ctx, cancel := context.WithCancel(ctx)
	pf := &prefetch{cancel: cancel, done: make(chan struct{})}
	var desc ocispec.Descriptor
	if resolved != nil {
		desc = *resolved
	}
	unpack := dst.(transfer.ImageUnpacker).UnpackPlatforms()[0]
	platform := platforms.Only(unpack.Platform)
	go func() {
		defer close(pf.done)
		pf.desc, pf.layers, pf.err = rec.Prefetch(ctx, desc, platform, s.local.present(ctx), s.local.snapshotted(ctx, unpack))
		if pf.err == nil {
			missing := source.Bytes(pf.layers)
			need(pf.layers)
			s.pulls.sized(p, missing)
		}
	}()
	return pf
}

// wait ends the prefetch, at once when abandon is set (the pull will not
// run), and returns the reference's descriptor if it was resolved. What a
// prefetch failed to do, the pull does as usual, and reports any error in
// containerd's words.
func (pf *prefetch) wait(ctx context.Context, abandon bool) (ocispec.Descriptor, bool) {
	if abandon {
		pf.cancel()
	}
	<-pf.done
	pf.cancel()
	if pf.err != nil && !abandon {
		log.G(ctx).WithError(pf.err).Debug("prefetch failed; the pull fetches as usual once it has a slot")
	}
	return pf.desc, pf.desc.Digest != ""
}
