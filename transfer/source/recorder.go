package source

import (
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/hostclient"
)

// Recorder notes which registry host answered each manifest and blob
// request of one pull. containerd falls back host by host for every
// request, so one image can come from several hosts.
type Recorder struct {
	mu         sync.Mutex
	manifests  []manifestHit
	blobs      map[string]*BlobStats // by host
	retryAfter time.Duration         // longest Retry-After seen since asked
	// onBlob, when set, learns every chunk of blob bytes as it is read.
	onBlob func(dgst string, n int64)
	// attempts are what each host answered, per manifest or blob, in the
	// order containerd asked: what explains a failed pull.
	attempts []hostclient.Attempt
	// fetched, when set, learns when the pull has nothing left to fetch.
	fetched *fetchWatch
	// onSize, when set, learns the bytes left to fetch once the image
	// manifest of a watched pull is in; onBlobs, the blobs.
	onSize  func(layers []ocispec.Descriptor)
	onBlobs func(blobs []ocispec.Descriptor)
	// lazy counts the layers a remote snapshotter mounted lazily.
	lazy map[digest.Digest]bool
}

// MountedLazily notes that a remote snapshotter mounted layer d without a
// fetch (transfer/lazy): a watched pull then waits for no bytes of it. It
// returns the layer's size, or 0 when no image manifest listed it.
func (r *Recorder) MountedLazily(d digest.Digest) int64 {
	r.mu.Lock()
	if r.lazy == nil {
		r.lazy = map[digest.Digest]bool{}
	}
	r.lazy[d] = true
	r.mu.Unlock()
	return r.fetchWatch().mountedLazily(d)
}

// OnSize calls fn once the image manifest of a pull watched with OnFetched
// is in, with the image's layers not yet on the node: what the pull has
// left to do, to place it in the lanes (lane.Ticket). fn runs on the
// fetching goroutine, before any layer is asked for.
func (r *Recorder) OnSize(fn func(layers []ocispec.Descriptor)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onSize = fn
}

// OnBlobs calls fn once the image manifest of a pull watched with
// OnFetched is in, with the blobs (config and layers) the pull will fetch:
// for the node's peers to expect them (transfer/peers). fn runs on the
// fetching goroutine, before any of them is asked for.
func (r *Recorder) OnBlobs(fn func(blobs []ocispec.Descriptor)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onBlobs = fn
}

// manifestBody tells a watched pull the body of a manifest it fetched;
// an image manifest's layers are what it has left to fetch.
func (r *Recorder) manifestBody(b []byte) {
	w := r.fetchWatch()
	missing, ok := w.manifestBody(b)
	if !ok {
		return
	}
	r.mu.Lock()
	onSize, onBlobs := r.onSize, r.onBlobs
	r.mu.Unlock()
	if onSize != nil {
		onSize(missing)
	}
	if onBlobs != nil {
		onBlobs(w.toFetch())
	}
}

// OnBlobBytes calls fn with the blob digest and byte count of every chunk
// read from a registry from now on. fn runs on the fetching goroutine: it
// must be quick and must not block.
func (r *Recorder) OnBlobBytes(fn func(dgst string, n int64)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.onBlob = fn
}

type manifestHit struct {
	host, repo, ref string
}

// BlobStats is what one host served of a pull's blobs.
type BlobStats struct {
	Blobs int   `json:"blobs"`
	Bytes int64 `json:"bytes"`
	// Lazy counts the layers a remote snapshotter mounted from this host
	// (the one that resolved the image) instead of containerd fetching
	// them; their bytes come later, on demand, and are not counted.
	Lazy int `json:"lazy,omitempty"`
}

// Result is what a pull's recorder says about where it came from.
type Result struct {
	// Source is the reference as the host that resolved it knows it:
	// host[:port]/repository:tag or host[:port]/repository@sha256:…;
	// empty when no host was asked (nothing to resolve).
	Source string
	// Blobs is, per host, the blobs fetched and their bytes; empty when
	// every blob was already present.
	Blobs map[string]BlobStats
}

// BlobsLabel encodes Blobs for a label and verbose status: JSON, sorted by
// host, empty when no blob was fetched.
func (r Result) BlobsLabel() string {
	if len(r.Blobs) == 0 {
		return ""
	}
	b, err := json.Marshal(r.Blobs) // maps encode with sorted keys
	if err != nil {
		return ""
	}
	return string(b)
}

// Result returns the source of ref (a tag or a digest, as the pull asked
// for it): the first host whose manifest answer for that reference was
// below 400, which for a tag is the host that resolved it.
func (r *Recorder) Result(ref string) Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	var res Result
	for _, m := range r.manifests {
		if m.ref == ref {
			sep := ":"
			if strings.Contains(ref, ":") {
				sep = "@"
			}
			res.Source = m.host + "/" + m.repo + sep + ref
			break
		}
	}
	if len(r.blobs) > 0 {
		res.Blobs = make(map[string]BlobStats, len(r.blobs))
		for h, s := range r.blobs {
			res.Blobs[h] = *s
		}
	}
	if len(r.lazy) > 0 && len(r.manifests) > 0 {
		if res.Blobs == nil {
			res.Blobs = map[string]BlobStats{}
		}
		h := r.manifests[0].host
		s := res.Blobs[h]
		s.Lazy = len(r.lazy)
		res.Blobs[h] = s
	}
	return res
}

// manifest notes a manifest answer below 400.
func (r *Recorder) manifest(host, repo, ref string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.manifests = append(r.manifests, manifestHit{host: host, repo: repo, ref: ref})
}

// noteRetryAfter keeps the longest Retry-After (parsed by retryAfter) an
// error answer asked for.
func (r *Recorder) noteRetryAfter(d time.Duration) {
	if d > 0 {
		r.mu.Lock()
		r.retryAfter = max(r.retryAfter, d)
		r.mu.Unlock()
	}
}

// RetryAfter returns the longest Retry-After a registry asked for since the
// last call, and forgets it.
func (r *Recorder) RetryAfter() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.retryAfter
	r.retryAfter = 0
	return d
}

// blob counts one blob for host and returns the func its bytes go to.
func (r *Recorder) blob(host, dgst string) func(int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.blobs == nil {
		r.blobs = map[string]*BlobStats{}
	}
	s := r.blobs[host]
	if s == nil {
		s = &BlobStats{}
		r.blobs[host] = s
	}
	s.Blobs++
	fw := r.fetched
	return func(n int64) {
		r.mu.Lock()
		s.Bytes += n
		onBlob := r.onBlob
		r.mu.Unlock()
		if onBlob != nil {
			onBlob(dgst, n)
		}
		fw.blobBytes(digest.Digest(dgst), n)
	}
}
