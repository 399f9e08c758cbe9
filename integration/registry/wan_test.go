package registry

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// bodyHandler answers every request with size bytes.
func bodyHandler(size int) http.Handler {
	body := bytes.Repeat([]byte("x"), size)
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) })
}

func TestWANLatencyPerRequest(t *testing.T) {
	srv := httptest.NewServer(WAN{Latency: 30 * time.Millisecond}.Handler(bodyHandler(1)))
	t.Cleanup(srv.Close)
	for range 3 {
		start := time.Now()
		resp, err := http.Get(srv.URL)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "each request waits the latency, also on a reused connection")
	}
}

// The budget is shared: two concurrent responses together take as long as
// their sum at the profile's rate, not as long as one of them.
func TestWANBandwidthShared(t *testing.T) {
	const (
		bps     = 4 << 20
		size    = 512 << 10
		clients = 4
	)
	srv := httptest.NewServer(WAN{BytesPerSecond: bps}.Handler(bodyHandler(size)))
	t.Cleanup(srv.Close)

	start := time.Now()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != size {
				t.Errorf("read %d bytes (%v), want %d", n, err, size)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// All bytes but the first burst wait for the shared budget: 2 MiB at
	// 4 MiB/s is about 500 ms. Per-response budgets would take about 125 ms.
	minShared := time.Duration(float64(clients*size-wanChunk) / bps * float64(time.Second))
	require.GreaterOrEqual(t, elapsed, minShared, "responses did not share one budget")
	require.Less(t, elapsed, 4*minShared, "the budget throttles far below its rate")
}

// A registry behind ServeWAN serves pulls on the WAN address and records
// them, while its own address stays fast.
func TestServeWAN(t *testing.T) {
	r := Start(t, Options{Name: "wan"})
	p := r.Push(t, "wan/app", "v1", Image{Layers: []int64{64 << 10}, Seed: 1})
	r.Reset()
	host := r.ServeWAN(t, WAN{Latency: 20 * time.Millisecond, BytesPerSecond: 1 << 20})
	require.NotEqual(t, r.Host(), host)

	c := newClient(t)
	start := time.Now()
	resp := c.get(http.MethodGet, "http://"+host+"/v2/wan/app/blobs/"+p.Layers[0].String())
	require.Equal(t, http.StatusOK, resp.status)
	require.EqualValues(t, p.LayerSizes[0], len(resp.body))
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	require.Equal(t, 1, r.Count(func(req Request) bool { return req.Kind == KindBlob && req.Status == 200 }))
}

// Cut drops a response mid-body and refuses new connections, as a crashed
// host would; Close afterwards reports the same.
func TestFrontCut(t *testing.T) {
	r := Start(t, Options{Name: "cut"})
	p := r.Push(t, "cut/app", "v1", Image{Layers: []int64{1 << 20}, Seed: 1})
	f, err := r.ListenWAN(WAN{BytesPerSecond: 256 << 10})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })

	resp, err := http.Get(f.URL() + "/v2/cut/app/blobs/" + p.Layers[0].String())
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = io.ReadFull(resp.Body, make([]byte, 64<<10))
	require.NoError(t, err)

	require.NoError(t, f.Cut())
	n, err := io.Copy(io.Discard, resp.Body)
	require.Error(t, err, "the body went on after Cut")
	require.Less(t, n, p.LayerSizes[0])
	_, err = http.Get(f.URL() + "/v2/")
	require.Error(t, err, "a new connection was accepted after Cut")
	require.NoError(t, f.Close())
}
