// Package sourcelabel names the labels Pullwise keeps on image records
// about where a pull came from (KEP-4589), and writes them. It is a leaf:
// the CRI interceptors that copy the labels need nothing of the transfer
// engine that sets them.
package sourcelabel

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/images"
)

const (
	// PullSource is the reference as the registry that served the pull
	// knows it.
	PullSource = "io.pullwise.pull-source"
	// BlobSources is, per host, how many blobs and bytes it served, as
	// JSON; it shows when a mirror lacked some layers.
	BlobSources = "io.pullwise.pull-source.blobs"
)

// Of returns the pull-source labels among labels, both keys present, ""
// where one is missing: as Set takes them, to copy a record's source to
// another.
func Of(labels map[string]string) map[string]string {
	return map[string]string{PullSource: labels[PullSource], BlobSources: labels[BlobSources]}
}

// Set writes the labels of want that rec lacks or has otherwise, by field
// path, so other labels (CRI's, pins) are left alone; an empty value
// removes the label.
func Set(ctx context.Context, store images.Store, rec images.Image, want map[string]string) error {
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
