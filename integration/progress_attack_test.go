package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

// Limits of the progress server in the attack test: low, so that the
// attack goes well past them.
const (
	attackMaxConns      = 32
	attackClientTimeout = time.Second
	attackTokenTTL      = 2 * time.Second
)

var attackConfig = fmt.Sprintf(`[plugins."io.containerd.grpc.v1.pullwise"]
  progress_max_connections = %d
  progress_client_timeout = %q
  progress_token_ttl = %q
`, attackMaxConns, attackClientTimeout, attackTokenTTL)

// madeUpTokens GETs n random tokens on the progress server at base through
// a few kept-alive connections, and returns the answers by status.
func madeUpTokens(base string, n, workers int) map[int]int {
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: workers, MaxIdleConnsPerHost: workers}}
	defer client.CloseIdleConnections()
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		next     atomic.Int64
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				var b [16]byte
				_, _ = rand.Read(b[:])
				code := -1 // no answer at all
				if resp, err := client.Get(base + "/progress/" + hex.EncodeToString(b[:])); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				statuses[code]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return statuses
}

// slowLoris opens n connections to the server at base that send part of a
// request line and nothing more; they are closed when the test ends.
func slowLoris(tb testing.TB, base string, n int) []net.Conn {
	tb.Helper()
	addr := strings.TrimPrefix(base, "http://")
	conns := make([]net.Conn, 0, n)
	for range n {
		// The kernel completes connections beyond the server's cap into its
		// accept queue; a refused one would only mean the queue is full.
		c, err := net.Dial("tcp", addr)
		if err != nil {
			continue
		}
		tb.Cleanup(func() { c.Close() })
		_, _ = c.Write([]byte("GET /progress/"))
		conns = append(conns, c)
	}
	return conns
}

// neverReader opens the stream at u with a tiny receive buffer and never
// reads it.
func neverReader(tb testing.TB, u string) net.Conn {
	tb.Helper()
	p, err := url.Parse(u)
	if err != nil {
		tb.Fatal(err)
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	c, err := d.Dial("tcp", p.Host)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", p.RequestURI(), p.Host); err != nil {
		tb.Fatal(err)
	}
	return c
}

func statusOf(t *testing.T, u string) int {
	t.Helper()
	c := http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %.80s: %v", u, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestProgressAttack: while a pod's pull streams its progress to a reader
// and to one that never reads, the progress server gets 10,000 made-up
// tokens, replayed and expired ones, another pod's token, slow-loris
// connections far past its cap, and oversized paths and queries. Each gets
// 404 or 400; the pull completes and its stream reaches the end; the
// daemon's goroutines and heap stay bounded and come back down.
func TestProgressAttack(t *testing.T) {
	// Layers are streamed here: inflated whole, their buffers (bounded on
	// their own, transfer/gunzip) would count in the live heap this test
	// bounds for the attack.
	e, _ := newPodEnv(t, envOptions{extraConfig: attackConfig, noKeepAlive: true, transfer: "gzip_read_ahead = false\n"})
	img := e.push("attack/app", "v1", registry.Image{Layers: []int64{2 << 20, 2 << 20, 2 << 20, 2 << 20}, Seed: 6000})
	podA, cfgA := e.runPod(t, "a")
	podB, _ := e.runPod(t, "b")
	ctx := context.Background()

	urlA := e.progressURL(&api.ImagePullProgressRequest{PodSandboxId: podA})
	base := urlA[:strings.Index(urlA, "/progress/")]
	// The test's own connections count in the baseline: the image
	// service's reconnects lazily after newPodEnv's restart.
	e.listPulls()
	if _, err := e.images.ListImages(ctx, nil); err != nil {
		t.Fatal(err)
	}
	baseGoroutines := e.d.Goroutines(t)
	baseHeap := e.d.LiveHeap(t)

	// The pull takes a few seconds, so the attack meets it in flight.
	throttleBlobs(e.upstream, 512<<10)
	lines := readStream(t, ctx, urlA)
	neverReader(t, e.progressURL(&api.ImagePullProgressRequest{PodSandboxId: podA}))
	pullErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, cfgA); pullErr <- err }()
	eventually(t, 10*time.Second, "the pull in flight", func() bool {
		p := e.listPulls()
		return len(p) == 1 && p[0].GetBytesDone() > 0
	})

	// Peak goroutines and heap while the attack runs.
	var peakG, peakHeap atomic.Int64
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peakG.Store(max(peakG.Load(), int64(e.d.Goroutines(t))))
			peakHeap.Store(max(peakHeap.Load(), e.d.LiveHeap(t)))
			select {
			case <-stopSampling:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()

	loris := slowLoris(t, base, 8*attackMaxConns)
	tokens := madeUpTokens(base, 10000, 8)
	if tokens[404] != 10000 {
		t.Errorf("10,000 made-up tokens got %v, want 404 for each", tokens)
	}

	for _, tc := range []struct {
		name string
		path string
		want int
	}{
		{"oversized token", "/progress/" + strings.Repeat("f", 4<<10), 404},
		{"oversized query", "/progress/" + strings.Repeat("ab", 16) + "?follow=false&pad=" + strings.Repeat("x", 4<<10), 400},
		{"bad follow", "/progress/" + strings.Repeat("ab", 16) + "?follow=%00", 400},
		// Beyond 8 KiB of headers net/http answers for the server.
		{"path beyond the header limit", "/progress/" + strings.Repeat("f", 64<<10), 431},
	} {
		if got := statusOf(t, base+tc.path); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	replayed := e.progressURL(&api.ImagePullProgressRequest{PodSandboxId: podA})
	if got := statusOf(t, replayed+"?follow=false"); got != 200 {
		t.Fatalf("a fresh URL: %d", got)
	}
	if got := statusOf(t, replayed+"?follow=false"); got != 404 {
		t.Errorf("a replayed URL: %d, want 404", got)
	}
	expired := e.progressURL(&api.ImagePullProgressRequest{PodSandboxId: podA})
	time.Sleep(attackTokenTTL + 200*time.Millisecond) // the lifetime is what is tested
	if got := statusOf(t, expired+"?follow=false"); got != 404 {
		t.Errorf("an expired URL: %d, want 404", got)
	}
	// Pod B's URL, used while pod A pulls, shows nothing of it.
	var other []progressLine
	for l := range readStream(t, ctx, e.progressURL(&api.ImagePullProgressRequest{PodSandboxId: podB})+"?follow=false") {
		other = append(other, l)
	}
	if len(other) != 0 {
		t.Errorf("pod B's stream during pod A's pull: %+v, want nothing", other)
	}

	if err := <-pullErr; err != nil {
		t.Fatalf("the pull under attack: %v", err)
	}
	var last progressLine
	for l := range lines {
		last = l
	}
	if last.Image != img.Ref || last.Layer != "" || last.Progress != img.LayerBytes() || last.Total != img.LayerBytes() {
		t.Fatalf("the stream under attack ended on %+v, want the complete image line", last)
	}
	close(stopSampling)
	<-sampled
	t.Logf("%d slow-loris connections opened; goroutines %d at rest, %d at the peak; live heap %.1f MiB at rest, %.1f MiB at the peak",
		len(loris), baseGoroutines, peakG.Load(), float64(baseHeap)/(1<<20), float64(peakHeap.Load())/(1<<20))
	// Each connection served costs a few goroutines (its own, net/http's
	// background read, the stream's) and the cap bounds them; without it
	// the slow-loris connections alone would add hundreds.
	if limit := int64(baseGoroutines + 3*attackMaxConns + 20); peakG.Load() > limit {
		t.Errorf("goroutines peaked at %d under attack, above %d (rest %d, cap %d connections)", peakG.Load(), limit, baseGoroutines, attackMaxConns)
	}
	if limit := baseHeap + 16<<20; peakHeap.Load() > limit {
		t.Errorf("live heap peaked at %.1f MiB under attack, rest %.1f MiB", float64(peakHeap.Load())/(1<<20), float64(baseHeap)/(1<<20))
	}
	// The slow clients are cut by the header timeout, the never-reader's
	// stream ends with the pull and its idle connection times out.
	e.awaitGoroutines(baseGoroutines, 60*time.Second)
}
