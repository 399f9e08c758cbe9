package source

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
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
	return res
}

// wrap returns a client that records through this recorder.
func (r *Recorder) wrap(c *http.Client) *http.Client {
	if c == nil {
		c = &http.Client{}
	}
	wrapped := *c
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	wrapped.Transport = &recordingTransport{next: next, rec: r}
	return &wrapped
}

type recordingTransport struct {
	next http.RoundTripper
	rec  *Recorder
}

func (t *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if resp.StatusCode >= 400 {
		if d := retryAfter(resp.Header.Get("Retry-After")); d > 0 {
			t.rec.mu.Lock()
			t.rec.retryAfter = max(t.rec.retryAfter, d)
			t.rec.mu.Unlock()
		}
		return resp, nil
	}
	kind, repo, ref := parsePath(req.URL.Path)
	switch kind {
	case "manifests":
		t.rec.mu.Lock()
		t.rec.manifests = append(t.rec.manifests, manifestHit{host: req.URL.Host, repo: repo, ref: ref})
		t.rec.mu.Unlock()
	case "blobs":
		if req.Method != http.MethodGet {
			break
		}
		// Bytes are counted as the body is read, since a fetch may stop
		// early or resume with a range request.
		resp.Body = &countingBody{ReadCloser: resp.Body, add: t.rec.blob(req.URL.Host, ref)}
	}
	return resp, nil
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

// retryAfter parses a Retry-After header: seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
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
	return func(n int64) {
		r.mu.Lock()
		s.Bytes += n
		onBlob := r.onBlob
		r.mu.Unlock()
		if onBlob != nil {
			onBlob(dgst, n)
		}
	}
}

type countingBody struct {
	io.ReadCloser
	add func(int64)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.add(int64(n))
	}
	return n, err
}

// parsePath splits a registry API path into the kind (manifests, blobs),
// the repository as the host knows it, and the reference. The API root
// "/v2" is dropped, but a mirror's own prefix (override_path) is kept:
// it is part of how that mirror names the repository.
func parsePath(p string) (kind, repo, ref string) {
	for _, k := range []string{"manifests", "blobs"} {
		i := strings.LastIndex(p, "/"+k+"/")
		if i < 0 {
			continue
		}
		ref = p[i+len(k)+2:]
		if ref == "" || strings.Contains(ref, "/") {
			return "", "", "" // e.g. /blobs/uploads/…
		}
		segs := strings.Split(strings.Trim(p[:i], "/"), "/")
		if j := slices.Index(segs, "v2"); j >= 0 {
			segs = slices.Delete(segs, j, j+1)
		}
		return k, strings.Join(segs, "/"), ref
	}
	return "", "", ""
}
