package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

// BenchmarkProgressUnderAttack: pulls of a 5×20 MiB image, with one
// subscriber reading its progress, quiet and while the progress server
// (default limits) is attacked: made-up tokens without pause, 256
// slow-loris connections, a subscriber that never reads, oversized paths.
// The attacker runs on the same CPUs; the same flood aimed at a bare
// net/http server in the benchmark's process ("elsewhere") shows what the
// flood costs the node by itself.
func BenchmarkProgressUnderAttack(b *testing.B) {
	e := newEnv(b, envOptions{logLevel: "info"})
	bare := httptest.NewServer(http.NotFoundHandler())
	defer bare.Close()
	const layer = 20 << 20
	const bytes = 5 * layer
	ctx := context.Background()
	elapsed := map[string]time.Duration{}
	// target is the server attacked: "" for none.
	pull := func(name, ref, target string) {
		url := e.progressURL(&api.ImagePullProgressRequest{Image: ref})
		base := url[:strings.Index(url, "/progress/")]
		attack := target != ""
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(url)
			if err != nil {
				b.Error(err)
				return
			}
			defer resp.Body.Close()
			for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
			}
		}()
		stop := make(chan struct{})
		if attack {
			if target == base {
				neverReader(b, e.progressURL(&api.ImagePullProgressRequest{Image: ref}))
			}
			slowLoris(b, target, 256)
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						madeUpTokens(target, 200, 4)
						if resp, err := http.Get(target + "/progress/" + strings.Repeat("f", 6<<10)); err == nil {
							resp.Body.Close()
						}
					}
				}()
			}
		}
		start := time.Now()
		if _, err := e.images.PullImage(ctx, criImage(ref), nil, nil); err != nil {
			b.Fatal(err)
		}
		elapsed[name] += time.Since(start)
		close(stop)
		wg.Wait()
	}
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		var refs []string
		for k := range 3 {
			img := e.upstream.Push(b, fmt.Sprintf("bench/attack%d-%d", i, k), "v1",
				registry.Image{Layers: []int64{layer, layer, layer, layer, layer}, Seed: int64(70000 + i*10 + k)})
			refs = append(refs, img.Ref)
		}
		b.StartTimer()
		progress := e.progressURL(&api.ImagePullProgressRequest{Image: "none"})
		progress = progress[:strings.Index(progress, "/progress/")]
		// Rotate who goes first, so no one always meets a cold cache.
		runs := []func(){
			func() { pull("quiet", refs[0], "") },
			func() { pull("attack", refs[1], progress) },
			func() { pull("elsewhere", refs[2], bare.URL) },
		}
		for k := range runs {
			runs[(i+k)%len(runs)]()
		}
	}
	n := float64(b.N)
	mbps := func(name string) float64 { return bytes / (1 << 20) / (elapsed[name].Seconds() / n) }
	b.ReportMetric(mbps("quiet"), "quiet-MiB/s")
	b.ReportMetric(mbps("attack"), "attack-MiB/s")
	b.ReportMetric(mbps("elsewhere"), "elsewhere-MiB/s")
	b.ReportMetric(mbps("attack")/mbps("quiet"), "ratio-attack")
	b.ReportMetric(mbps("elsewhere")/mbps("quiet"), "ratio-elsewhere")
}
