package fleet

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/integration/registry"
)

// serve serves the registry at RegistryHost inside ns, each request
// delayed by latency, until the test ends (before the registry stops).
func (f *Fleet) serve(t testing.TB, ns string, latency time.Duration) {
	t.Helper()
	ln, err := listenIn(ns, RegistryHost)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: registry.WAN{Latency: latency}.Handler(f.Registry), ReadHeaderTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close()
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("fleet registry: %v", err)
		}
	})
}

// Image is an image pushed to the fleet's registry.
type Image struct {
	registry.Pushed
	// Ref is the reference nodes pull: RegistryHost/repo:tag.
	Ref string
	// Bytes is one copy of it: manifest, config and layers.
	Bytes int64
}

// Blobs are the config and the layers.
func (img Image) Blobs() []digest.Digest { return append([]digest.Digest{img.Config}, img.Layers...) }

// Push builds img and writes it to repo:tag through the registry's
// loopback address, then forgets that traffic.
func (f *Fleet) Push(t testing.TB, repo, tag string, img registry.Image) Image {
	t.Helper()
	built, err := registry.BuildImage(img)
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := built.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	p, err := f.Registry.PushImage(t.Context(), repo, tag, built)
	if err != nil {
		t.Fatal(err)
	}
	f.Registry.Reset()
	return Image{Pushed: p, Ref: RegistryHost + "/" + repo + ":" + tag,
		Bytes: int64(len(manifest)) + p.ConfigSize + p.LayerBytes()}
}

// Egress is what the registry sent since the last TakeEgress or Push.
type Egress struct {
	// Bytes counts response bodies (manifests and blobs), not headers.
	Bytes int64
	// BlobBytes counts the bodies of blob GETs alone.
	BlobBytes int64
	// BlobGets counts the GETs of each blob, whatever their answer.
	BlobGets map[digest.Digest]int
}

// MaxGets is the most GETs any one blob had.
func (e Egress) MaxGets() int {
	n := 0
	for _, c := range e.BlobGets {
		n = max(n, c)
	}
	return n
}

// TakeEgress waits until no request is in flight, returns what the
// registry sent since the last call (or Push) and starts counting anew.
func (f *Fleet) TakeEgress(t testing.TB) Egress {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := f.Registry.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	e := Egress{BlobGets: map[digest.Digest]int{}}
	for _, req := range f.Registry.Requests() {
		e.Bytes += req.Bytes
		if req.Kind == registry.KindBlob && req.Method == http.MethodGet {
			e.BlobGets[digest.Digest(req.Reference)]++
			e.BlobBytes += req.Bytes
		}
	}
	f.Registry.Reset()
	return e
}
