package transfer

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/source"
)

// Labels Pullwise keeps on image records.
const (
	// LabelPullSource is the reference as the registry that served the
	// pull knows it (KEP-4589).
	LabelPullSource = "io.pullwise.pull-source"
	// LabelBlobSources is, per host, how many blobs and bytes it served,
	// as JSON; it shows when a mirror lacked some layers.
	LabelBlobSources = "io.pullwise.pull-source.blobs"
)

// sourceLabels returns the labels a pull leaves: what the recorder saw,
// and for what it did not see (a re-pull fetches no cached blob; a digest
// already present asks no host), what the image carried before.
func sourceLabels(res source.Result, prev map[string]string) map[string]string {
	out := map[string]string{
		LabelPullSource:  prev[LabelPullSource],
		LabelBlobSources: prev[LabelBlobSources],
	}
	if res.Source != "" {
		out[LabelPullSource] = res.Source
	}
	if b := res.BlobsLabel(); b != "" {
		out[LabelBlobSources] = b
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
		if img.Labels[LabelPullSource] != "" && (target == "" || img.Target.Digest == target) {
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
		if err := SetLabels(ctx, s.local.Images, rec, labels); err != nil {
			return err
		}
	}
	return nil
}

// SetLabels writes the labels of want that rec lacks or has otherwise; an
// empty value removes the label.
func SetLabels(ctx context.Context, store images.Store, rec images.Image, want map[string]string) error {
	var paths []string
	for k, v := range want {
		if rec.Labels[k] != v {
			paths = append(paths, "labels."+k)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	update := images.Image{Name: rec.Name, Labels: map[string]string{}}
	for k, v := range want {
		if v != "" {
			update.Labels[k] = v
		}
	}
	if _, err := store.Update(ctx, update, paths...); err != nil {
		return fmt.Errorf("label %s: %w", rec.Name, err)
	}
	return nil
}
