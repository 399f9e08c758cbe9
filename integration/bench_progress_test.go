package integration

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

// BenchmarkProgressThroughput: pulls of a 5×20 MiB image on stock
// containerd, on Pullwise with no subscriber and with 100 subscribers
// streaming its progress.
func BenchmarkProgressThroughput(b *testing.B) {
	c := newContenders(b, "")
	const layer = 20 << 20
	const bytes = 5 * layer
	ctx := context.Background()
	elapsed := map[string]time.Duration{}
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		var refs []string
		for k := range 3 {
			img := c.pullwise.upstream.Push(b, fmt.Sprintf("bench/tp%d-%d", i, k), "v1",
				registry.Image{Layers: []int64{layer, layer, layer, layer, layer}, Seed: int64(40000 + i*10 + k)})
			refs = append(refs, img.Ref)
		}
		b.StartTimer()
		pull := func(name string, e *env, ref string, subscribers int) {
			var wg sync.WaitGroup
			for range subscribers {
				url := e.progressURL(&api.ImagePullProgressRequest{Image: ref})
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := http.Get(url)
					if err != nil {
						b.Error(err)
						return
					}
					defer resp.Body.Close()
					sc := bufio.NewScanner(resp.Body)
					for sc.Scan() {
					}
				}()
			}
			start := time.Now()
			if _, err := e.images.PullImage(ctx, criImage(ref), nil, nil); err != nil {
				b.Fatal(err)
			}
			elapsed[name] += time.Since(start)
			wg.Wait()
		}
		// Rotate who goes first, so no one always meets a cold cache.
		runs := []func(){
			func() { pull("stock", c.stock, refs[0], 0) },
			func() { pull("pullwise", c.pullwise, refs[1], 0) },
			func() { pull("pullwise-100", c.pullwise, refs[2], 100) },
		}
		for k := range runs {
			runs[(i+k)%len(runs)]()
		}
	}
	n := float64(b.N)
	mbps := func(name string) float64 { return bytes / (1 << 20) / (elapsed[name].Seconds() / n) }
	b.ReportMetric(mbps("stock"), "stock-MiB/s")
	b.ReportMetric(mbps("pullwise"), "pullwise-MiB/s")
	b.ReportMetric(mbps("pullwise-100"), "pullwise-100subs-MiB/s")
	b.ReportMetric(mbps("pullwise")/mbps("stock"), "ratio-0subs")
	b.ReportMetric(mbps("pullwise-100")/mbps("stock"), "ratio-100subs")
}

// BenchmarkProgressLatency: from the registry starting to send a layer to
// a subscriber seeing that layer move.
func BenchmarkProgressLatency(b *testing.B) {
	e := newEnv(b, envOptions{})
	ctx := context.Background()
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		img := e.upstream.Push(b, fmt.Sprintf("bench/lat%d", i), "v1", registry.Image{Layers: []int64{4 << 20}, Seed: int64(50000 + i)})
		e.upstream.Reset()
		throttleBlobs(e.upstream, 8<<20)
		url := e.progressURL(&api.ImagePullProgressRequest{Image: img.Ref})
		resp, err := http.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		seen := make(chan time.Time, 1)
		go func() {
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if strings.Contains(sc.Text(), `"layer":"`+img.Layers[0].String()) && !strings.Contains(sc.Text(), `"progress":0,`) {
					seen <- time.Now()
					break
				}
			}
			for sc.Scan() {
			}
		}()
		b.StartTimer()
		if _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		first := <-seen
		if err := e.upstream.WaitIdle(ctx); err != nil {
			b.Fatal(err)
		}
		for _, r := range e.upstream.Requests() {
			if r.Reference == img.Layers[0].String() && r.Method == "GET" {
				lat = append(lat, first.Sub(r.Start))
			}
		}
		e.upstream.SetFault(nil)
		b.StartTimer()
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	}
}

// BenchmarkProgressSubscriberMemory: containerd's resident memory per idle
// subscriber of a pull in flight.
func BenchmarkProgressSubscriberMemory(b *testing.B) {
	e := newEnv(b, envOptions{})
	img := e.push("bench/mem", "v1", registry.Image{Layers: []int64{1 << 20, 1 << 20, 1 << 20}, Seed: 60000})
	release := e.upstream.HoldBlobs(b, func(string) bool { return true })
	defer release()
	ctx := context.Background()
	go func() { _, _ = e.images.PullImage(ctx, criImage(img.Ref), nil, nil) }()
	eventually(b, 10*time.Second, "pull in flight", func() bool { return len(e.listPulls()) == 1 })
	const subs = 1000
	var perSub float64
	for b.Loop() {
		b.StopTimer()
		before := rss(b, e.d.PID())
		sctx, cancel := context.WithCancel(ctx)
		var opened sync.WaitGroup
		for range subs {
			url := e.progressURL(&api.ImagePullProgressRequest{Image: img.Ref})
			opened.Add(1)
			go func() {
				req, _ := http.NewRequestWithContext(sctx, http.MethodGet, url, nil)
				resp, err := http.DefaultClient.Do(req)
				opened.Done()
				if err != nil {
					return
				}
				defer resp.Body.Close()
				<-sctx.Done()
			}()
		}
		b.StartTimer()
		opened.Wait()
		b.StopTimer()
		perSub += float64(rss(b, e.d.PID())-before) / subs
		cancel()
		b.StartTimer()
	}
	b.ReportMetric(perSub/float64(b.N)/1024, "KiB/subscriber")
}

func rss(tb testing.TB, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	tb.Fatal("no VmRSS")
	return 0
}
