package peers

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/transfer/hostclient"
)

// Transport makes the node one more registry host for containerd's
// resolver: a GET of /v2/<repo>/blobs/<digest> is answered through
// Node.Fetch, with 206 and Content-Range for a "Range: bytes=N-" or
// "bytes=N-M" header. Everything else (manifests, tags, HEAD, uploads)
// and every blob no peer serves is answered 404 at once, without
// touching the network, so containerd moves on to the next host and
// manifests and tags always come from a registry, with its credentials.
type Transport struct{ node *Node }

// NewTransport returns the http.RoundTripper face of n.
func NewTransport(n *Node) *Transport { return &Transport{node: n} }

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	dgst, ok := blobDigest(req.URL.Path)
	if req.Method != http.MethodGet || !ok {
		return reply(req, http.StatusNotFound, nil, 0), nil
	}
	ctx := req.Context()
	f, size, p, err := t.node.fetch(ctx, dgst, -1)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return reply(req, http.StatusNotFound, nil, 0), nil
	}
	start, end, ranged := byteRange(req.Header.Get("Range"), size)
	if ranged && start >= size {
		f.Close()
		resp := reply(req, http.StatusRequestedRangeNotSatisfiable, nil, 0)
		resp.Header.Set("Content-Range", fmt.Sprintf("bytes */%d", size))
		return resp, nil
	}
	status := http.StatusOK
	if ranged {
		status = http.StatusPartialContent
	}
	body := spooled{io.NewSectionReader(f, start, end-start), f}
	resp := reply(req, status, body, end-start)
	resp.Header.Set("Content-Type", "application/octet-stream")
	resp.Header.Set("Docker-Content-Digest", dgst.String())
	resp.Header.Set(hostclient.PeerHeader, p.String())
	if ranged {
		resp.Header.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end-1, size))
	}
	return resp, nil
}

// blobDigest returns the digest of a blob path, /v2/<repo>/blobs/<digest>.
func blobDigest(path string) (digest.Digest, bool) {
	i := strings.LastIndex(path, "/blobs/")
	if i < 0 || !strings.HasPrefix(path, "/v2/") || i <= len("/v2") {
		return "", false
	}
	d, err := digest.Parse(path[i+len("/blobs/"):])
	return d, err == nil
}

// byteRange reads a single "bytes=N-" or "bytes=N-M" range against a
// blob of size bytes, as the half-open [start, end). Any other form is
// ignored, as HTTP allows, and the whole blob is sent.
func byteRange(h string, size int64) (start, end int64, ranged bool) {
	spec, ok := strings.CutPrefix(h, "bytes=")
	first, last, ok2 := strings.Cut(spec, "-")
	if !ok || !ok2 || strings.Contains(spec, ",") {
		return 0, size, false
	}
	start, err := strconv.ParseInt(first, 10, 64)
	if err != nil || start < 0 {
		return 0, size, false
	}
	end = size
	if last != "" {
		l, err := strconv.ParseInt(last, 10, 64)
		if err != nil || l < start {
			return 0, size, false
		}
		end = min(l+1, size)
	}
	return start, end, true
}

func reply(req *http.Request, status int, body io.ReadCloser, length int64) *http.Response {
	if body == nil {
		body = http.NoBody
	}
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", status, http.StatusText(status)),
		StatusCode:    status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Length": {strconv.FormatInt(length, 10)}},
		Body:          body,
		ContentLength: length,
		Request:       req,
	}
}
