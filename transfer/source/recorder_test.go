package source

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path, kind, repo, ref string
	}{
		{"/v2/team/app/manifests/v1", "manifests", "team/app", "v1"},
		{"/v2/team/app/manifests/sha256:abc", "manifests", "team/app", "sha256:abc"},
		{"/v2/library/busybox/blobs/sha256:abc", "blobs", "library/busybox", "sha256:abc"},
		// override_path mirror keeping its prefix
		{"/v2/proxy-cache/library/nginx/manifests/1.27", "manifests", "proxy-cache/library/nginx", "1.27"},
		{"/registry/mirror/team/app/manifests/v1", "manifests", "registry/mirror/team/app", "v1"},
		// a repository named like the API parts
		{"/v2/org/manifests/app/manifests/v1", "manifests", "org/manifests/app", "v1"},
		{"/v2/team/app/blobs/uploads/", "", "", ""},
		{"/v2/", "", "", ""},
		{"/token", "", "", ""},
	} {
		kind, repo, ref := parsePath(tc.path)
		if kind != tc.kind || repo != tc.repo || ref != tc.ref {
			t.Errorf("parsePath(%q) = %q %q %q, want %q %q %q", tc.path, kind, repo, ref, tc.kind, tc.repo, tc.ref)
		}
	}
}

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
	c := rec.wrap(&http.Client{}, Hosts{}, endpoint{})
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
