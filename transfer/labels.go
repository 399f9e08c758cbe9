package transfer

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/source"
	"github.com/pullwise/pullwise/transfer/sourcelabel"
)

// sourceLabels returns the labels a pull leaves: what the recorder saw,
// and for what it did not see (a re-pull fetches no cached blob; a digest
// already present asks no host), what the image carried before.
func sourceLabels(res source.Result, prev map[string]string) map[string]string {
	out := sourcelabel.Of(prev)
	if res.Source != "" {
		out[sourcelabel.PullSource] = res.Source
	}
	if b := res.BlobsLabel(); b != "" {
		out[sourcelabel.BlobSources] = b
	}
	return out
}

// previousLabels returns the source labels the image had before the pull:
// from the records the destination names, else from any record of the
// same target.
func (s *Service) previousLabels(ctx context.Context, dst transfer.ImageStorer, target digest.Digest) map[string]string {
	var candidates []images.Image
	if l, ok := dst.(transfer.ImageLookup); ok && s.local.Images != nil {
		candidates, _ = l.Lookup(ctx, s.local.Images)
	}
	if target != "" && s.local.Images != nil {
		more, _ := s.local.Images.List(ctx, "target.digest=="+target.String())
		candidates = append(candidates, more...)
	}
	for _, img := range candidates {
		if img.Labels[sourcelabel.PullSource] != "" && (target == "" || img.Target.Digest == target) {
			return img.Labels
		}
	}
	return nil
}

// labelStored sets labels on every record the destination stored. The
// transfer image store rewrites records without field paths on a re-pull,
// wiping labels, so this runs after every pull. Only labels that differ are
// written, by field path, so other labels (CRI's, pins) are left alone.
func (s *Service) labelStored(ctx context.Context, dst transfer.ImageStorer, labels map[string]string) error {
	l, ok := dst.(transfer.ImageLookup)
	if !ok || s.local.Images == nil {
		return nil
	}
	recs, err := l.Lookup(ctx, s.local.Images)
	if err != nil {
		return fmt.Errorf("look up stored images: %w", err)
	}
	for _, rec := range recs {
		if err := sourcelabel.Set(ctx, s.local.Images, rec, labels); err != nil {
			return err
		}
	}
	return nil
}
