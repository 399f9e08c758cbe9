package cripull

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	transferimage "github.com/containerd/containerd/v2/core/transfer/image"
	"github.com/containerd/platforms"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/contenttest"
	"github.com/pullwise/pullwise/internal/metadatatest"
)

const (
	gcConfigLabel    = "containerd.io/gc.ref.content.config"
	gcLayerPrefix    = "containerd.io/gc.ref.content.l."
	gcManifestPrefix = "containerd.io/gc.ref.content.m."

	snapshotRefAnnotation      = "containerd.io/snapshot/cri.image-ref"
	snapshotLayerAnnotation    = "containerd.io/snapshot/cri.layer-digest"
	snapshotManifestAnnotation = "containerd.io/snapshot/cri.manifest-digest"
	snapshotAnnotationPrefix   = "containerd.io/snapshot/"
)

func newContentStore(t *testing.T) content.Store {
	t.Helper()
	return contenttest.NewStore(t)
}

func writeBlob(t *testing.T, cs content.Store, mediaType string, data []byte) ocispec.Descriptor {
	return metadatatest.WriteBlob(t, context.Background(), cs, mediaType, data)
}

func writeJSON(t *testing.T, cs content.Store, mediaType string, v any) ocispec.Descriptor {
	return metadatatest.WriteJSON(t, context.Background(), cs, mediaType, v)
}

// writeImage writes an OCI image manifest with a config and two layers.
func writeImage(t *testing.T, cs content.Store, p ocispec.Platform, seed string) (manifest, config ocispec.Descriptor, layers []ocispec.Descriptor) {
	t.Helper()
	config = writeJSON(t, cs, ocispec.MediaTypeImageConfig, ocispec.Image{Platform: p})
	layers = []ocispec.Descriptor{
		writeBlob(t, cs, ocispec.MediaTypeImageLayerGzip, []byte(seed+"layer-0")),
		writeBlob(t, cs, ocispec.MediaTypeImageLayerGzip, []byte(seed+"layer-1")),
	}
	manifest = writeJSON(t, cs, ocispec.MediaTypeImageManifest, ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    config,
		Layers:    layers,
	})
	return manifest, config, layers
}

func newDestination(ref string, discard, annotations bool) destination {
	return destination{
		imageStore:  transferimage.NewStore(ref, transferimage.WithPlatforms(platforms.DefaultSpec())),
		ref:         ref,
		discard:     discard,
		annotations: annotations,
	}
}

// filterModes are the four ways CRI's config can set up a destination.
var filterModes = []struct {
	name        string
	discard     bool
	annotations bool
}{
	{name: "keep layers, no annotations"},
	{name: "keep layers, annotations", annotations: true},
	{name: "discard layers, no annotations", discard: true},
	{name: "discard layers, annotations", discard: true, annotations: true},
}

func TestDestinationImageFilterManifest(t *testing.T) {
	const ref = "reg.example/app:1"
	for _, tc := range filterModes {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cs := newContentStore(t)
			manifest, config, layers := writeImage(t, cs, platforms.DefaultSpec(), "")

			h := newDestination(ref, tc.discard, tc.annotations).ImageFilter(images.ChildrenHandler(cs), cs)
			children, err := h(ctx, manifest)
			if err != nil {
				t.Fatalf("handler: %v", err)
			}

			// The pull fetches the config and every layer either way:
			// discarding only changes what GC may collect afterwards.
			if len(children) != 3 {
				t.Fatalf("children = %d, want config and 2 layers", len(children))
			}
			if children[0].Digest != config.Digest {
				t.Errorf("first child = %s, want the config %s", children[0].Digest, config.Digest)
			}

			info, err := cs.Info(ctx, manifest.Digest)
			if err != nil {
				t.Fatal(err)
			}
			if got := info.Labels[gcConfigLabel]; got != config.Digest.String() {
				t.Errorf("label %s = %q, want %s", gcConfigLabel, got, config.Digest)
			}
			if tc.discard {
				for k, v := range info.Labels {
					if strings.HasPrefix(k, gcLayerPrefix) {
						t.Errorf("discarding manifest still references layer: %s=%s", k, v)
					}
				}
			} else {
				for i, l := range layers {
					k := gcLayerPrefix + strconv.Itoa(i)
					if got := info.Labels[k]; got != l.Digest.String() {
						t.Errorf("label %s = %q, want %s", k, got, l.Digest)
					}
				}
			}

			var gotLayers int
			for _, c := range children {
				if !images.IsLayerType(c.MediaType) {
					for k := range c.Annotations {
						if strings.HasPrefix(k, snapshotAnnotationPrefix) {
							t.Errorf("non-layer %s has snapshot annotation %s", c.MediaType, k)
						}
					}
					continue
				}
				gotLayers++
				if !tc.annotations {
					for k := range c.Annotations {
						if strings.HasPrefix(k, snapshotAnnotationPrefix) {
							t.Errorf("layer %s has snapshot annotation %s with annotations off", c.Digest, k)
						}
					}
					continue
				}
				want := map[string]string{
					snapshotRefAnnotation:      ref,
					snapshotLayerAnnotation:    c.Digest.String(),
					snapshotManifestAnnotation: manifest.Digest.String(),
				}
				for k, v := range want {
					if got := c.Annotations[k]; got != v {
						t.Errorf("layer %s annotation %s = %q, want %q", c.Digest, k, got, v)
					}
				}
			}
			if gotLayers != len(layers) {
				t.Errorf("layer children = %d, want %d", gotLayers, len(layers))
			}
		})
	}
}

// An index is narrowed to the node's platform whether or not layers are
// discarded: CRI pulls one platform.
func TestDestinationImageFilterIndex(t *testing.T) {
	const ref = "reg.example/app:1"
	other := ocispec.Platform{OS: "plan9", Architecture: "386"}
	for _, tc := range filterModes {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			cs := newContentStore(t)
			host := platforms.DefaultSpec()
			hostManifest, _, _ := writeImage(t, cs, host, "host")
			otherManifest, _, _ := writeImage(t, cs, other, "other")
			hostManifest.Platform = &host
			otherManifest.Platform = &other
			index := writeJSON(t, cs, ocispec.MediaTypeImageIndex, ocispec.Index{
				Versioned: specs.Versioned{SchemaVersion: 2},
				MediaType: ocispec.MediaTypeImageIndex,
				Manifests: []ocispec.Descriptor{otherManifest, hostManifest},
			})

			h := newDestination(ref, tc.discard, tc.annotations).ImageFilter(images.ChildrenHandler(cs), cs)
			children, err := h(ctx, index)
			if err != nil {
				t.Fatalf("handler: %v", err)
			}
			if len(children) != 1 || children[0].Digest != hostManifest.Digest {
				t.Fatalf("index children = %v, want only the host platform's manifest %s", children, hostManifest.Digest)
			}
			info, err := cs.Info(ctx, index.Digest)
			if err != nil {
				t.Fatal(err)
			}
			// containerd labels before it filters, so the index may also
			// reference the other platform's manifest; it must reference
			// the one pulled.
			var referenced bool
			for k, v := range info.Labels {
				if strings.HasPrefix(k, gcManifestPrefix) && v == hostManifest.Digest.String() {
					referenced = true
				}
			}
			if !referenced {
				t.Errorf("index labels %v do not reference the host manifest %s", info.Labels, hostManifest.Digest)
			}
		})
	}
}
