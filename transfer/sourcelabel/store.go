package sourcelabel

import (
	"context"
	"maps"

	"github.com/containerd/containerd/v2/core/images"
)

// Store is the image store containerd's transfer service writes a pull's
// records through. A record written whole (a create, or an update without
// field paths, as containerd's transfer image store writes every record it
// stores) gets the pull-source labels the pull's context carries
// (WithLabels) in that same write.
//
// Why: each metadata write is a synced database transaction, one writer
// on the node at a time; labelling a record after containerd wrote it
// costs a second one, which in a burst of pulls waits behind every other
// pull's writes (docs/benchmarks-history.md). Records written any other
// way, or without labels in the context, pass through unchanged.
type Store struct {
	images.Store
}

type labelsKey struct{}

// WithLabels has the records stored under ctx through a Store labelled
// with what labels returns then: a pull knows its source only once its
// blobs are in, just before containerd stores its records. Empty values
// are left out.
func WithLabels(ctx context.Context, labels func() map[string]string) context.Context {
	return context.WithValue(ctx, labelsKey{}, labels)
}

func (s Store) Create(ctx context.Context, img images.Image) (images.Image, error) {
	return s.Store.Create(ctx, labelled(ctx, img))
}

func (s Store) Update(ctx context.Context, img images.Image, fieldpaths ...string) (images.Image, error) {
	if len(fieldpaths) == 0 {
		img = labelled(ctx, img)
	}
	return s.Store.Update(ctx, img, fieldpaths...)
}

// labelled returns img with ctx's labels added, on a copy of its label
// map: the caller may store the same map in several records.
func labelled(ctx context.Context, img images.Image) images.Image {
	fn, _ := ctx.Value(labelsKey{}).(func() map[string]string)
	if fn == nil {
		return img
	}
	want := fn()
	out := make(map[string]string, len(img.Labels)+len(want))
	maps.Copy(out, img.Labels)
	for k, v := range want {
		if v != "" {
			out[k] = v
		}
	}
	img.Labels = out
	return img
}
