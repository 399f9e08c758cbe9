package registry

import (
	"net/http"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPushAndFetchByTag(t *testing.T) {
	reg := Start(t, Options{Name: "upstream"})
	p := reg.Push(t, "team/app", "v1", Image{Layers: []int64{4 << 10, 1 << 10}, Seed: 1})
	assert.Equal(t, reg.Host()+"/team/app:v1", p.Ref)
	c := newClient(t)

	resp := c.get(http.MethodGet, manifestURL(reg, "team/app", "v1"))
	require.Equal(t, http.StatusOK, resp.status)
	assert.Equal(t, p.Digest.String(), resp.header.Get("Docker-Content-Digest"))
	assert.Equal(t, p.Digest, digest.FromBytes(resp.body))

	for i, d := range p.Layers {
		resp := c.get(http.MethodGet, blobURL(reg, "team/app", d.String()))
		require.Equal(t, http.StatusOK, resp.status)
		assert.Equal(t, d, digest.FromBytes(resp.body))
		assert.Len(t, resp.body, int(p.LayerSizes[i]))
	}
}

func TestRecorderParsesManifestAndBlobRequests(t *testing.T) {
	reg := Start(t, Options{})
	p := reg.Push(t, "team/app", "v1", Image{Layers: []int64{8 << 10}, Seed: 2})
	reg.Reset()
	c := newClient(t)

	manifest := c.get(http.MethodGet, manifestURL(reg, "team/app", p.Digest.String()))
	c.get(http.MethodHead, manifestURL(reg, "team/app", "v1"))
	c.get(http.MethodGet, blobURL(reg, "team/app", p.Layers[0].String()))
	waitIdle(t, reg)

	want := []Request{
		{Method: http.MethodGet, Kind: KindManifest, Reference: p.Digest.String(), Bytes: int64(len(manifest.body))},
		{Method: http.MethodHead, Kind: KindManifest, Reference: "v1", Bytes: 0},
		{Method: http.MethodGet, Kind: KindBlob, Reference: p.Layers[0].String(), Bytes: p.LayerSizes[0]},
	}
	got := reg.Requests()
	require.Len(t, got, len(want))
	for i, w := range want {
		g := got[i]
		assert.Equal(t, w.Method, g.Method, "request %d", i)
		assert.Equal(t, w.Kind, g.Kind, "request %d", i)
		assert.Equal(t, "team/app", g.Repo, "request %d", i)
		assert.Equal(t, w.Reference, g.Reference, "request %d", i)
		assert.Equal(t, http.StatusOK, g.Status, "request %d", i)
		assert.Equal(t, w.Bytes, g.Bytes, "request %d", i)
		assert.False(t, g.Faulted, "request %d", i)
		assert.False(t, g.End.Before(g.Start), "request %d", i)
	}
	assert.Equal(t, 1, reg.Count(func(r Request) bool { return r.Kind == KindBlob }))
}

func TestPeakConcurrency(t *testing.T) {
	reg := Start(t, Options{})
	repos := []string{"a", "b", "c"}
	for _, repo := range repos {
		reg.Push(t, repo, "v1", Image{Layers: []int64{1}})
	}
	reg.Reset()

	// Hold five requests (two repos twice) inside the registry at once, so
	// the peaks are exact rather than timing-dependent.
	const held = 5
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	reg.SetFault(func(Request) *Fault {
		mu.Lock()
		if arrived++; arrived == held {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-t.Context().Done(): // don't wedge cleanup if the test fails
		}
		return nil
	})

	c := newClient(t)
	var wg sync.WaitGroup
	for _, repo := range []string{"a", "a", "b", "b", "c"} {
		wg.Go(func() {
			resp, err := c.do(t.Context(), http.MethodHead, manifestURL(reg, repo, "v1"), nil)
			assert.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.status)
		})
	}
	wg.Wait()
	waitIdle(t, reg)

	assert.Equal(t, held, reg.PeakConcurrency())
	assert.Equal(t, len(repos), reg.PeakRepos())
	assert.Equal(t, map[string]int{"a": 2, "b": 2, "c": 1}, reg.PeakByRepo())

	reg.Reset()
	assert.Zero(t, reg.PeakConcurrency())
	assert.Zero(t, reg.PeakRepos())
	assert.Empty(t, reg.Requests())
}

func TestProxyServesUpstreamImage(t *testing.T) {
	up := Start(t, Options{Name: "upstream"})
	p := up.Push(t, "library/app", "v1", Image{Layers: []int64{16 << 10, 2 << 10}, Seed: 3})
	mirror := Start(t, Options{Name: "mirror", ProxyRemoteURL: up.URL()})
	up.Reset()
	c := newClient(t)

	resp := c.get(http.MethodGet, manifestURL(mirror, "library/app", "v1"))
	require.Equal(t, http.StatusOK, resp.status)
	assert.Equal(t, p.Digest, digest.FromBytes(resp.body))
	for _, d := range p.Layers {
		resp := c.get(http.MethodGet, blobURL(mirror, "library/app", d.String()))
		require.Equal(t, http.StatusOK, resp.status)
		assert.Equal(t, d, digest.FromBytes(resp.body))
	}
	waitIdle(t, mirror)
	waitIdle(t, up)

	fromUpstream := func(kind Kind, ref string) int {
		return up.Count(func(r Request) bool {
			return r.Method == http.MethodGet && r.Kind == kind && r.Repo == "library/app" &&
				r.Reference == ref && r.Status == http.StatusOK
		})
	}
	assert.Positive(t, fromUpstream(KindManifest, "v1")+fromUpstream(KindManifest, p.Digest.String()),
		"mirror fetched the manifest from upstream")
	for i, d := range p.Layers {
		assert.Equal(t, 1, fromUpstream(KindBlob, d.String()), "layer %d fetched once", i)
	}

	// Blobs are now cached: fetching again must not reach upstream.
	up.Reset()
	for _, d := range p.Layers {
		resp := c.get(http.MethodGet, blobURL(mirror, "library/app", d.String()))
		require.Equal(t, http.StatusOK, resp.status)
	}
	waitIdle(t, mirror)
	assert.Zero(t, up.Count(func(r Request) bool { return r.Kind == KindBlob }))
}

func TestRedirectBlobsToCDN(t *testing.T) {
	reg := Start(t, Options{RedirectBlobs: true})
	p := reg.Push(t, "team/app", "v1", Image{Layers: []int64{16 << 10}, Seed: 3})
	reg.Reset()
	c := newClient(t)

	// Manifests come from the registry itself.
	manifest := c.get(http.MethodGet, manifestURL(reg, "team/app", "v1"))
	require.Equal(t, http.StatusOK, manifest.status)

	// A blob GET is redirected, and the CDN serves the blob, with Range.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(blobURL(reg, "team/app", p.Layers[0].String()))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusTemporaryRedirect, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Location"), "http://"+reg.CDN().Host()+"/")

	blob := c.get(http.MethodGet, blobURL(reg, "team/app", p.Layers[0].String()))
	require.Equal(t, http.StatusOK, blob.status)
	assert.Equal(t, p.Layers[0], digest.FromBytes(blob.body))
	tail := c.get(http.MethodGet, blobURL(reg, "team/app", p.Layers[0].String()), func(r *http.Request) { r.Header.Set("Range", "bytes=100-") })
	require.Equal(t, http.StatusPartialContent, tail.status)
	assert.Equal(t, blob.body[100:], tail.body)

	require.NoError(t, reg.CDN().WaitIdle(t.Context()))
	require.Len(t, reg.CDN().Requests(), 2)
	assert.Equal(t, p.LayerSizes[0], reg.CDN().Requests()[0].Bytes)
	assert.Equal(t, 1, reg.CDN().PeakConcurrency())
}
