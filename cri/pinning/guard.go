package pinning

import (
	"context"
	"fmt"
	"strings"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// pullwiseSection holds protect_pinned_images.
const pullwiseSection = `[plugins."io.containerd.grpc.v1.pullwise"]`

// PinnedError is returned for a removal that would delete a pinned image.
// It is an errdefs.ErrFailedPrecondition: the removal can succeed once the
// image is unpinned, and its message says how.
type PinnedError struct {
	// Image is the pinned record's name.
	Image string
	// Keys are the pinned_images keys that pin it; empty for a pin set by
	// hand.
	Keys []string
}

func (e *PinnedError) Error() string {
	allow := "to allow removing pinned images, set protect_pinned_images = false in " + pullwiseSection
	if len(e.Keys) == 0 {
		return fmt.Sprintf("image %q is pinned: it carries the label %s=%s, which was not set from pinned_images; "+
			"to unpin it, remove the label (ctr -n %s images label %s %s=); %s",
			e.Image, PinnedLabel, PinnedValue, criconfig.Namespace, e.Image, PinnedLabel, allow)
	}
	keys := "pinned_images." + strings.Join(e.Keys, " and pinned_images.")
	verb := "names"
	if len(e.Keys) > 1 {
		verb = "name"
	}
	return fmt.Sprintf("image %q is pinned: %s in %s %s it; "+
		"to unpin it, change %s and restart containerd; %s",
		e.Image, keys, criImagesSection, verb, keys, allow)
}

// Unwrap classes the error for errdefs and errgrpc.
func (e *PinnedError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Guard decides whether removing image records must be refused.
type Guard struct {
	store images.Store
	pins  *Pins
}

// NewGuard returns a Guard that looks records up in store.
func NewGuard(store images.Store, pins *Pins) *Guard {
	return &Guard{store: store, pins: pins}
}

// CheckRemoval returns a *PinnedError for the first of names that is a
// pinned record in CRI's namespace, and nil when none is.
//
// A record is pinned when config pins it, even if the reconciler has not
// labelled it yet, or when it carries a pin without the marker (an
// operator's). A marked pin that config no longer names is on its way out
// and does not block removal.
func (g *Guard) CheckRemoval(ctx context.Context, names ...string) error {
	ctx = namespaces.WithNamespace(ctx, criconfig.Namespace)
	records, err := g.store.List(ctx)
	if err != nil {
		return fmt.Errorf("list images in namespace %s to check for pins: %w", criconfig.Namespace, err)
	}
	plan := g.pins.plan(records)
	byName := make(map[string]images.Image, len(records))
	for _, r := range records {
		byName[r.Name] = r
	}
	for _, name := range names {
		rec, ok := byName[name]
		if !ok {
			continue
		}
		if keys := plan[name]; len(keys) > 0 {
			return &PinnedError{Image: name, Keys: keys}
		}
		if isPinnedByHand(rec) {
			return &PinnedError{Image: name}
		}
	}
	return nil
}
