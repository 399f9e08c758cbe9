package source

import (
	"encoding/json"
	"maps"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// fetchWatch learns, from the manifests and blobs a pull fetches through
// the recorder, when every blob of its image has been downloaded: the pull
// then needs the registry no more, only unpacking is left. It reports
// that once, and only when it is sure: a blob it cannot account for (one
// another pull is downloading, a manifest it never saw) keeps it quiet.
type fetchWatch struct {
	mu       sync.Mutex
	present  func(digest.Digest) bool // committed in the content store
	done     func()                   // called once; nil after
	expected map[digest.Digest]int64  // config and layers of image manifests seen
	got      map[digest.Digest]int64  // blob bytes read, across range requests
	manifest bool                     // an image manifest was seen
	configs  map[digest.Digest]bool   // config blobs of the manifests seen
	// unpacked, when set, counts the leading layers of an image whose
	// snapshots exist (see OnUnpacked); image is the last image manifest
	// seen, what it is asked about, and skipped its answer once known:
	// asked once, not at every blob the pull completes.
	unpacked Unpacked
	// lazy are layers a remote snapshotter mounted without a fetch.
	lazy  map[digest.Digest]bool
	image struct {
		config  digest.Digest
		layers  []ocispec.Descriptor
		skipped map[digest.Digest]bool
	}
}

// Unpacked counts the leading layers of an image (its config and manifest
// layers) whose chain of snapshots is on the node; known is false when it
// cannot tell yet, as while the config is not in the content store.
type Unpacked func(config digest.Digest, layers []ocispec.Descriptor) (n int, known bool)

// OnFetched calls done once every blob of the pull's image manifest has
// been read from a registry or is already in the content store (present).
// done runs on a fetching goroutine and must not block. A pull of several
// platforms' images must not use it: it cannot tell when the last
// platform's manifest has come.
func (r *Recorder) OnFetched(present func(digest.Digest) bool, done func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fetched = &fetchWatch{present: present, done: done, expected: map[digest.Digest]int64{}, got: map[digest.Digest]int64{}}
}

// OnUnpacked tells a pull watched with OnFetched which of its layers it
// will not fetch because their snapshots exist, as fn counts them. A
// layer's blob can be gone while its snapshot stays (CRI's
// discard_unpacked_layers), and containerd's unpacker then skips its
// download: without this, such a pull would never be done fetching, and
// its size would count bytes it never asks for. Call it after OnFetched.
func (r *Recorder) OnUnpacked(fn Unpacked) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fetched != nil {
		r.fetched.mu.Lock()
		r.fetched.unpacked = fn
		r.fetched.mu.Unlock()
	}
}

func (r *Recorder) fetchWatch() *fetchWatch {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fetched
}

// manifestBody is the body of a manifest answer; what it lists is added to
// the blobs the pull must fetch. An index lists manifests, not blobs: the
// platform's image manifest follows it. For an image manifest it returns
// its layers not yet on the node, and true.
func (w *fetchWatch) manifestBody(b []byte) ([]ocispec.Descriptor, bool) {
	if w == nil {
		return nil, false
	}
	config, layers, ok := imageManifest(b)
	if !ok {
		return nil, false
	}
	skipped, known := w.unpackedLayers(config.Digest, layers)
	missing := missingLayers(layers, func(d digest.Digest) bool { return skipped[d] || w.present(d) })
	w.mu.Lock()
	w.manifest = true
	w.image.config, w.image.layers, w.image.skipped = config.Digest, layers, nil
	if known {
		w.image.skipped = skipped
	}
	if w.configs == nil {
		w.configs = map[digest.Digest]bool{}
	}
	w.configs[config.Digest] = true
	for _, d := range append([]ocispec.Descriptor{config}, layers...) {
		w.expected[d.Digest] = d.Size
	}
	w.mu.Unlock()
	w.check()
	return missing, true
}

// toFetch lists the blobs of the last image manifest seen that the pull
// will fetch: those neither present nor under an unpacked layer.
func (w *fetchWatch) toFetch() []ocispec.Descriptor {
	w.mu.Lock()
	config, layers, skipped := w.image.config, w.image.layers, w.image.skipped
	w.mu.Unlock()
	var out []ocispec.Descriptor
	if !w.present(config) {
		out = append(out, ocispec.Descriptor{Digest: config, Size: w.expectedSize(config)})
	}
	for _, l := range layers {
		if !skipped[l.Digest] && !w.present(l.Digest) {
			out = append(out, l)
		}
	}
	return out
}

// expectedSize is the size the manifest gave blob d.
func (w *fetchWatch) expectedSize(d digest.Digest) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.expected[d]
}

// imageManifest parses an image manifest's config and layers; ok is false
// for anything else, an index among them.
func imageManifest(b []byte) (config ocispec.Descriptor, layers []ocispec.Descriptor, ok bool) {
	var m struct {
		Config *ocispec.Descriptor  `json:"config"`
		Layers []ocispec.Descriptor `json:"layers"`
	}
	if json.Unmarshal(b, &m) != nil || m.Config == nil {
		return ocispec.Descriptor{}, nil, false
	}
	return *m.Config, m.Layers, true
}

// unpackedLayers returns the layers the pull will not fetch since their
// snapshots exist (never nil), and whether that is known yet. Without
// OnUnpacked, it is known: none.
func (w *fetchWatch) unpackedLayers(config digest.Digest, layers []ocispec.Descriptor) (map[digest.Digest]bool, bool) {
	out := map[digest.Digest]bool{}
	w.mu.Lock()
	fn := w.unpacked
	w.mu.Unlock()
	if fn == nil {
		return out, true
	}
	n, known := fn(config, layers)
	for _, l := range layers[:min(n, len(layers))] {
		out[l.Digest] = true
	}
	return out, known
}

// missingLayers lists the layers not on the node.
func missingLayers(layers []ocispec.Descriptor, present func(digest.Digest) bool) []ocispec.Descriptor {
	var out []ocispec.Descriptor
	for _, d := range layers {
		if !present(d.Digest) {
			out = append(out, d)
		}
	}
	return out
}

// mountedLazily notes layer d as mounted by a remote snapshotter, which
// leaves nothing to fetch for it, and returns its size (0 when the
// manifest has not listed it).
func (w *fetchWatch) mountedLazily(d digest.Digest) int64 {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	if w.lazy == nil {
		w.lazy = map[digest.Digest]bool{}
	}
	w.lazy[d] = true
	size := w.expected[d]
	w.mu.Unlock()
	w.check()
	return size
}

// isConfig reports whether d is the config of an image manifest the pull
// fetched. Only a watched pull (OnFetched) learns its manifests.
func (w *fetchWatch) isConfig(d digest.Digest) bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.configs[d]
}

// blobBytes counts n bytes of blob d read.
func (w *fetchWatch) blobBytes(d digest.Digest, n int64) {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.got[d] += n
	complete := w.manifest && w.got[d] >= w.expected[d] && w.expected[d] > 0
	w.mu.Unlock()
	if complete {
		w.check()
	}
}

// check calls done when nothing is left to fetch.
func (w *fetchWatch) check() {
	w.mu.Lock()
	if w.done == nil || !w.manifest {
		w.mu.Unlock()
		return
	}
	var missing []digest.Digest
	fetching := map[digest.Digest]bool{}
	for d, size := range w.expected {
		if w.got[d] < size {
			missing = append(missing, d)
			fetching[d] = w.got[d] > 0
		}
	}
	config, layers, skipped := w.image.config, w.image.layers, w.image.skipped
	lazy := maps.Clone(w.lazy)
	w.mu.Unlock()
	// Asked outside the lock: the content store and the snapshotter read
	// their databases.
	for _, d := range missing {
		if lazy[d] || w.present(d) {
			continue
		}
		if fetching[d] || d == config {
			// Being fetched, or the config, which no snapshot stands for.
			return
		}
		if skipped == nil {
			var known bool
			if skipped, known = w.unpackedLayers(config, layers); !known {
				return
			}
			w.mu.Lock()
			w.image.skipped = skipped
			w.mu.Unlock()
		}
		if !skipped[d] {
			return
		}
	}
	w.mu.Lock()
	done := w.done
	w.done = nil
	w.mu.Unlock()
	if done != nil {
		done()
	}
}
