package source

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pullwise/pullwise/transfer/hostclient"
)

func TestRecorderResult(t *testing.T) {
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.Contains(r.URL.Path, "/blobs/sha256:missing"):
			http.NotFound(w, r)
		case strings.Contains(r.URL.Path, "/blobs/"):
			io.WriteString(w, "0123456789")
		case strings.HasSuffix(r.URL.Path, "/manifests/v1"):
			w.WriteHeader(http.StatusOK)
		default:
			http.NotFound(w, r)
		}
	}))
	defer mirror.Close()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "abc")
	}))
	defer upstream.Close()

	rec := &Recorder{}
	c := hostclient.Wrap(&http.Client{}, hostclient.Node{}, hostclient.Endpoint{}, rec.observer())
	get := func(method, url string) {
		req, _ := http.NewRequest(method, url, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	get("HEAD", mirror.URL+"/v2/team/app/manifests/sha256:nope") // 404: not recorded
	get("HEAD", mirror.URL+"/v2/team/app/manifests/v1")
	get("GET", mirror.URL+"/v2/team/app/blobs/sha256:a")
	get("GET", mirror.URL+"/v2/team/app/blobs/sha256:b")
	get("GET", mirror.URL+"/v2/team/app/blobs/sha256:missing")
	get("GET", upstream.URL+"/v2/team/app/blobs/sha256:missing")

	res := rec.Result("v1")
	mh := strings.TrimPrefix(mirror.URL, "http://")
	uh := strings.TrimPrefix(upstream.URL, "http://")
	if res.Source != mh+"/team/app:v1" {
		t.Fatalf("source %q", res.Source)
	}
	if got := res.Blobs[mh]; got.Blobs != 2 || got.Bytes != 20 {
		t.Fatalf("mirror blobs %+v", got)
	}
	if got := res.Blobs[uh]; got.Blobs != 1 || got.Bytes != 3 {
		t.Fatalf("upstream blobs %+v", got)
	}
	if !strings.HasPrefix(res.BlobsLabel(), "{") || !strings.Contains(res.BlobsLabel(), `"blobs":2`) {
		t.Fatalf("blobs label %q", res.BlobsLabel())
	}
	if got := rec.Result("sha256:other"); got.Source != "" {
		t.Fatalf("source for a reference never resolved: %q", got.Source)
	}
	if (Result{}).BlobsLabel() != "" {
		t.Fatal("empty result has a blobs label")
	}
}
