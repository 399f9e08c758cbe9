package source

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// imageHost is a registry host serving one tag, "v1", and the manifests
// and blobs it was given by digest, counting the requests for each path.
type imageHost struct {
	*httptest.Server
	tag     ocispec.Descriptor
	content map[digest.Digest][]byte
	corrupt bool // serve manifests with a byte changed

	mu       sync.Mutex
	requests map[string]int // "GET /v2/…"
}

func newImageHost(t *testing.T) *imageHost {
	h := &imageHost{content: map[digest.Digest][]byte{}, requests: map[string]int{}}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.requests[r.Method+" "+r.URL.Path]++
		corrupt := h.corrupt
		h.mu.Unlock()
		if r.URL.Path == "/v2/" {
			return
		}
		d, body := h.tag, h.content[h.tag.Digest]
		if ref := path.Base(r.URL.Path); ref != "v1" {
			var ok bool
			if body, ok = h.content[digest.Digest(ref)]; !ok {
				http.NotFound(w, r)
				return
			}
			d = ocispec.Descriptor{MediaType: mediaTypeOf(body), Digest: digest.Digest(ref), Size: int64(len(body))}
		}
		if d.Digest == "" {
			http.NotFound(w, r)
			return
		}
		if corrupt && strings.Contains(r.URL.Path, "/manifests/") {
			body = append([]byte(nil), body...)
			body[len(body)-2] ^= 1
		}
		w.Header().Set("Content-Type", d.MediaType)
		w.Header().Set("Docker-Content-Digest", d.Digest.String())
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(h.Close)
	return h
}

func mediaTypeOf(b []byte) string {
	var m struct {
		MediaType string `json:"mediaType"`
	}
	if json.Unmarshal(b, &m) == nil && m.MediaType != "" {
		return m.MediaType
	}
	return "application/octet-stream"
}

// add stores v's JSON (or bytes) and returns its descriptor.
func (h *imageHost) add(t *testing.T, mediaType string, v any) ocispec.Descriptor {
	b, ok := v.([]byte)
	if !ok {
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	d := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	h.content[d.Digest] = b
	return d
}

// image adds an image manifest of layers, each n bytes, and returns it.
func (h *imageHost) image(t *testing.T, seed string, layers ...int) ocispec.Descriptor {
	config := h.add(t, ocispec.MediaTypeImageConfig, []byte(`{"seed":"`+seed+`"}`))
	m := ocispec.Manifest{MediaType: ocispec.MediaTypeImageManifest, Config: config}
	m.SchemaVersion = 2
	for i, n := range layers {
		l := bytes.Repeat([]byte{byte(i)}, n)
		l = append(l, seed...)
		m.Layers = append(m.Layers, h.add(t, ocispec.MediaTypeImageLayerGzip, l))
	}
	return h.add(t, ocispec.MediaTypeImageManifest, m)
}

func (h *imageHost) count(method, what string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for k, v := range h.requests {
		if strings.HasPrefix(k, method+" ") && strings.Contains(k, what) {
			n += v
		}
	}
	return n
}

// testFetcher is a recording Fetcher of host's team/app:v1.
func testFetcher(t *testing.T, h *imageHost) *Fetcher {
	dir := t.TempDir()
	host := strings.TrimPrefix(h.URL, "http://")
	if err := os.MkdirAll(filepath.Join(dir, host), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, host, "hosts.toml"), []byte(`server = "`+h.URL+`"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := &Fetcher{ref: host + "/team/app:v1", rec: &Recorder{}}
	f.resolver = NewResolver(context.Background(), Hosts{Dirs: []string{dir}}, f.rec)
	return f
}

func TestPrefetch(t *testing.T) {
	amd64 := ocispec.Platform{OS: "linux", Architecture: "amd64"}
	arm64 := ocispec.Platform{OS: "linux", Architecture: "arm64"}
	for _, tc := range []struct {
		name string
		// tag builds what v1 names and returns the image manifest the
		// pull of amd64 should get, and layers of it already on the node.
		tag     func(t *testing.T, h *imageHost) (image ocispec.Descriptor, present []digest.Digest)
		corrupt bool
		size    int64 // -1: Prefetch fails
	}{
		{"an image manifest", func(t *testing.T, h *imageHost) (ocispec.Descriptor, []digest.Digest) {
			h.tag = h.image(t, "a", 1000, 2000)
			return h.tag, nil
		}, false, 2000 + 1000 + 2},
		{"an index: the platform's manifest", func(t *testing.T, h *imageHost) (ocispec.Descriptor, []digest.Digest) {
			arm := h.image(t, "arm", 5000)
			arm.Platform = &arm64
			amd := h.image(t, "amd", 300, 400)
			amd.Platform = &amd64
			idx := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{arm, amd}}
			idx.SchemaVersion = 2
			h.tag = h.add(t, ocispec.MediaTypeImageIndex, idx)
			amd.Platform = nil
			return amd, nil
		}, false, 300 + 400 + 6},
		{"layers on the node are not counted", func(t *testing.T, h *imageHost) (ocispec.Descriptor, []digest.Digest) {
			h.tag = h.image(t, "b", 1000, 2000)
			var m ocispec.Manifest
			if err := json.Unmarshal(h.content[h.tag.Digest], &m); err != nil {
				t.Fatal(err)
			}
			return h.tag, []digest.Digest{m.Layers[1].Digest}
		}, false, 1000 + 1},
		{"an index entry without a platform: its config is containerd's to fetch", func(t *testing.T, h *imageHost) (ocispec.Descriptor, []digest.Digest) {
			m := h.image(t, "d", 1000)
			idx := ocispec.Index{MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{m}}
			idx.SchemaVersion = 2
			h.tag = h.add(t, ocispec.MediaTypeImageIndex, idx)
			return m, nil
		}, false, -1},
		{"a manifest named by a sha512 digest", func(t *testing.T, h *imageHost) (ocispec.Descriptor, []digest.Digest) {
			m := h.image(t, "e", 1000)
			b := h.content[m.Digest]
			m.Digest = digest.SHA512.FromBytes(b)
			h.content[m.Digest] = b
			h.tag = m
			return h.tag, nil
		}, false, 1000 + 1},
		{"bytes that do not match the digest are not kept", func(t *testing.T, h *imageHost) (ocispec.Descriptor, []digest.Digest) {
			h.tag = h.image(t, "c", 1000)
			return h.tag, nil
		}, true, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			h := newImageHost(t)
			want, present := tc.tag(t, h)
			f := testFetcher(t, h)
			h.corrupt = tc.corrupt
			isPresent := func(d digest.Digest) bool {
				for _, p := range present {
					if p == d {
						return true
					}
				}
				return false
			}
			desc, missing, err := f.Prefetch(ctx, ocispec.Descriptor{}, platforms.Only(amd64), isPresent, nil)
			size := Bytes(missing)
			if tc.size < 0 {
				if err == nil {
					t.Fatal("prefetch succeeded")
				}
			} else if err != nil || size != tc.size {
				t.Fatalf("Prefetch = %d, %v; want %d bytes", size, err, tc.size)
			}
			if desc.Digest != h.tag.Digest {
				t.Fatalf("resolved %s, want %s", desc.Digest, h.tag.Digest)
			}

			// containerd, once the pull runs, as the transfer service
			// watches it: the tag's target and the image manifest, from
			// memory when they were prefetched.
			var sized int64 = -1
			f.OnFetched(isPresent, func() {})
			f.OnSize(func(layers []ocispec.Descriptor) { sized = Bytes(layers) })
			h.corrupt = false
			before := h.count("GET", "/manifests/")
			fetcher, err := f.Fetcher(ctx, f.ref)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range []ocispec.Descriptor{h.tag, want} {
				rc, err := fetcher.Fetch(ctx, d)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(b, h.content[d.Digest]) {
					t.Fatalf("fetch %s: %v, %d bytes, want %d", d.Digest, err, len(b), len(h.content[d.Digest]))
				}
				if d.Digest == want.Digest {
					break
				}
			}
			again := h.count("GET", "/manifests/") - before
			if tc.size < 0 {
				if again == 0 {
					t.Fatal("a failed prefetch's manifests were served from memory")
				}
				return
			}
			if again != 0 {
				t.Fatalf("%d manifest GETs after the prefetch, want 0", again)
			}
			if sized != tc.size {
				t.Fatalf("the watched pull learned %d bytes, want %d", sized, tc.size)
			}
		})
	}
}
