package peers

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/pullwise/pullwise/transfer/hostclient"
)

// TestTransport: the node as a registry host answers blob GETs, whole
// or ranged, and everything else 404 at once.
func TestTransport(t *testing.T) {
	store := localStore(t)
	a, c := pair(t, store, nil, func(cfg *Config) { cfg.FindTimeout = time.Second })
	blob, dgst := held(t, store, a, 100<<10)
	_, missing := randomBlob(t, 10)
	client := &http.Client{Transport: NewTransport(c)}
	size := len(blob)

	for _, tc := range []struct {
		name, method, path, rng string
		status                  int
		body                    []byte
		contentRange            string
	}{
		{"blob", "GET", "/v2/library/app/blobs/" + dgst.String(), "", 200, blob, ""},
		{"blob from an offset", "GET", "/v2/library/app/blobs/" + dgst.String(), "bytes=1000-", 206, blob[1000:], "bytes 1000-" + strconv.Itoa(size-1) + "/" + strconv.Itoa(size)},
		{"blob range", "GET", "/v2/app/blobs/" + dgst.String(), "bytes=10-19", 206, blob[10:20], "bytes 10-19/" + strconv.Itoa(size)},
		{"range past the end", "GET", "/v2/app/blobs/" + dgst.String(), "bytes=" + strconv.Itoa(size) + "-", 416, nil, "bytes */" + strconv.Itoa(size)},
		{"blob no peer has", "GET", "/v2/app/blobs/" + missing.String(), "", 404, nil, ""},
		{"manifest", "GET", "/v2/app/manifests/latest", "", 404, nil, ""},
		{"manifest by digest", "HEAD", "/v2/app/manifests/" + dgst.String(), "", 404, nil, ""},
		{"blob HEAD", "HEAD", "/v2/app/blobs/" + dgst.String(), "", 404, nil, ""},
		{"tags", "GET", "/v2/app/tags/list", "", 404, nil, ""},
		{"upload", "POST", "/v2/app/blobs/uploads/", "", 404, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, "http://peers.invalid"+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.rng != "" {
				req.Header.Set("Range", tc.rng)
			}
			before := c.Stats()
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || !bytes.Equal(got, tc.body) {
				t.Fatalf("%d with %d bytes, want %d with %d", resp.StatusCode, len(got), tc.status, len(tc.body))
			}
			if resp.ContentLength != int64(len(tc.body)) || resp.Header.Get("Content-Length") != strconv.Itoa(len(tc.body)) {
				t.Fatalf("Content-Length %d (%q), want %d", resp.ContentLength, resp.Header.Get("Content-Length"), len(tc.body))
			}
			if cr := resp.Header.Get("Content-Range"); cr != tc.contentRange {
				t.Fatalf("Content-Range %q, want %q", cr, tc.contentRange)
			}
			if tc.status < 300 && resp.Header.Get(hostclient.PeerHeader) != a.ID().String() {
				t.Fatalf("%s %q, want A %s", hostclient.PeerHeader, resp.Header.Get(hostclient.PeerHeader), a.ID())
			}
			// A request that is not a blob GET never reaches the DHT:
			// a lookup would count a failure or bytes.
			if tc.method != "GET" || tc.status == 404 && tc.path != "/v2/app/blobs/"+missing.String() {
				if after := c.Stats(); after.BytesFetched != before.BytesFetched || after.FetchFailures[ReasonNoPeer] != before.FetchFailures[ReasonNoPeer] {
					t.Fatalf("stats moved: %+v -> %+v", before, after)
				}
			}
		})
	}
}
