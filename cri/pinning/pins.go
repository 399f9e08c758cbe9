// Package pinning keeps the images named by CRI's pinned_images config
// pinned (KEP-4056: kubelet relies on the runtime's Image.pinned to keep the
// sandbox image), however they arrived, and refuses their removal.
//
// Upstream CRI pins only records whose name equals a config value byte for
// byte, only ever adds the label, and lets RemoveImage delete pinned images.
// This package matches normalized references and image targets, unpins what
// an older config pinned, and decides whether a removal must be refused. It
// knows nothing of plugin wiring: plugin/pinning connects it to containerd.
package pinning

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/transfer/imageref"
)

const (
	// PinnedLabel and PinnedValue are upstream CRI's pin, the one label CRI
	// turns into Image.pinned.
	PinnedLabel = "io.cri-containerd.pinned"
	PinnedValue = "pinned"

	// MarkerLabel and MarkerValue mark pins derived from config. Only pins
	// carrying the marker are ever removed, so a pin an operator set by hand
	// survives config changes.
	MarkerLabel = "io.pullwise.pinned-by"
	MarkerValue = "config"

	// criImagesSection is where pinned_images lives in containerd's config.
	criImagesSection = `[plugins."io.containerd.cri.v1.images"]`
)

// Pins is the desired set: CRI's pinned_images, normalized.
type Pins struct {
	// byName maps a normalized reference to the pinned_images keys naming it.
	byName map[string][]string
	// byDigest maps the digest of references given by digest to their keys,
	// so records holding that content are pinned even when none of them is
	// named repo@digest (a pull by tag creates no such record).
	byDigest map[digest.Digest][]string
}

// NewPins normalizes pinned_images (key → reference) the way CRI normalizes
// image names: docker.io/library for short names and :latest when there is no
// tag; an image ID (sha256:…) names the image with that ID. Empty values
// name nothing. A value that is not a reference cannot
// match any image: it is left out and reported in the error, and the
// returned Pins still holds every other value, so that one typo does not
// unpin the sandbox image.
func NewPins(pinnedImages map[string]string) (*Pins, error) {
	p := &Pins{byName: map[string][]string{}, byDigest: map[digest.Digest][]string{}}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(pinnedImages)) {
		value := pinnedImages[key]
		if value == "" {
			continue
		}
		if _, err := digest.Parse(value); err == nil {
			// An image ID names CRI's ID record, as upstream matches it;
			// as a reference it would name docker.io/library/sha256.
			p.byName[value] = append(p.byName[value], key)
			continue
		}
		ref, err := reference.ParseDockerRef(value)
		if err != nil {
			errs = append(errs, fmt.Errorf("pinned_images.%s = %q is not an image reference: %w", key, value, err))
			continue
		}
		name := ref.String()
		p.byName[name] = append(p.byName[name], key)
		if c, ok := ref.(reference.Canonical); ok {
			p.byDigest[c.Digest()] = append(p.byDigest[c.Digest()], key)
		}
	}
	return p, errors.Join(errs...)
}

// PinnedImagesFromCRIConfig returns pinned_images from the CRI images
// plugin's effective config.
func PinnedImagesFromCRIConfig(criImageConfig any) (map[string]string, error) {
	c, err := criconfig.Read(criImageConfig)
	if err != nil {
		return nil, fmt.Errorf("read pinned_images: %w", err)
	}
	return c.PinnedImages, nil
}

// plan returns, for every record that config pins, the sorted
// pinned_images keys that pin it.
//
// A record is pinned when its name matches a config value, and so is every
// record with the same target: CRI reports an image under all its names (tag,
// repo@digest, and the bare image ID record it creates itself), and kubelet
// must see it pinned under each of them.
func (p *Pins) plan(records []images.Image) map[string][]string {
	byTarget := map[digest.Digest][]string{}
	for d, keys := range p.byDigest {
		byTarget[d] = append(byTarget[d], keys...)
	}
	for _, r := range records {
		if keys := p.byName[imageref.Normalize(r.Name)]; len(keys) > 0 {
			byTarget[r.Target.Digest] = append(byTarget[r.Target.Digest], keys...)
		}
	}
	plan := map[string][]string{}
	for _, r := range records {
		if keys := byTarget[r.Target.Digest]; len(keys) > 0 {
			keys = slices.Clone(keys)
			slices.Sort(keys)
			plan[r.Name] = slices.Compact(keys)
		}
	}
	return plan
}

func isPinned(r images.Image) bool       { return r.Labels[PinnedLabel] == PinnedValue }
func isMarked(r images.Image) bool       { return r.Labels[MarkerLabel] == MarkerValue }
func isPinnedByUs(r images.Image) bool   { return isPinned(r) && isMarked(r) }
func isPinnedByHand(r images.Image) bool { return isPinned(r) && !isMarked(r) }
