package registry

import (
	"net/http"
	"strings"
	"time"
)

// Kind classifies a registry API request by its path.
type Kind string

const (
	KindBase     Kind = "base"     // GET /v2/
	KindManifest Kind = "manifest" // /v2/<repo>/manifests/<ref>
	KindBlob     Kind = "blob"     // /v2/<repo>/blobs/<digest>
	KindUpload   Kind = "upload"   // /v2/<repo>/blobs/uploads/[<uuid>]
	KindTags     Kind = "tags"     // /v2/<repo>/tags/list
	KindOther    Kind = "other"    // anything else, e.g. /v2/_catalog
)

// Request is one request as seen by a Registry. A FaultFunc receives it
// before the registry handles it, so Status, Bytes and End are still zero
// there.
type Request struct {
	Method string
	Path   string
	// Header is the request's header. Shared between snapshots: read only.
	Header    http.Header
	Kind      Kind
	Repo      string // e.g. "library/busybox"; empty for base and other
	Reference string // tag or digest; upload session id for uploads
	// Status is the response status; 0 if nothing was written, e.g. the
	// client went away during an injected delay.
	Status int
	// Bytes counts response body bytes handed to the connection.
	Bytes int64
	Start time.Time
	End   time.Time
	// Faulted reports whether an injected fault changed the response:
	// a status, delay, throttle, truncation or auth rejection.
	Faulted bool
}

// Duration is how long the registry spent on the request.
func (r Request) Duration() time.Duration { return r.End.Sub(r.Start) }

func newRequest(req *http.Request) Request {
	kind, repo, ref := parsePath(req.URL.Path)
	return Request{
		Method:    req.Method,
		Path:      req.URL.Path,
		Header:    req.Header.Clone(),
		Kind:      kind,
		Repo:      repo,
		Reference: ref,
		Start:     time.Now(),
	}
}

// parsePath matches the distribution API routes from the end of the path
// because repository names may contain any number of slashes.
func parsePath(path string) (kind Kind, repo, ref string) {
	if path == "/v2/" || path == "/v2" {
		return KindBase, "", ""
	}
	rest, ok := strings.CutPrefix(path, "/v2/")
	if !ok {
		return KindOther, "", ""
	}
	parts := strings.Split(rest, "/")
	n := len(parts)
	name := func(end int) string { return strings.Join(parts[:end], "/") }
	switch {
	case n >= 3 && parts[n-2] == "blobs" && parts[n-1] == "uploads":
		return KindUpload, name(n - 2), ""
	case n >= 4 && parts[n-3] == "blobs" && parts[n-2] == "uploads":
		return KindUpload, name(n - 3), parts[n-1]
	case n >= 3 && parts[n-2] == "tags" && parts[n-1] == "list":
		return KindTags, name(n - 2), ""
	case n >= 3 && parts[n-2] == "manifests":
		return KindManifest, name(n - 2), parts[n-1]
	case n >= 3 && parts[n-2] == "blobs":
		return KindBlob, name(n - 2), parts[n-1]
	}
	return KindOther, "", ""
}

// FromContainerd reports whether containerd sent the request: its docker
// resolver sets the User-Agent "containerd/<version>" (stock builds
// "containerd/2.4.2+unknown", Pullwise "containerd/v2.4.2+pullwise..."). A
// remote snapshotter fetching for itself does not: stargz-snapshotter's
// blob fetcher sends Go's default, "Go-http-client/1.1".
func (r Request) FromContainerd() bool {
	return strings.HasPrefix(r.Header.Get("User-Agent"), "containerd/")
}
