package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// BenchmarkFailingMirror: pulls in turn through a mirror in front of
// upstream, with the mirror failing; Pullwise against stock in one run.
//   - 503: every mirror request answers 503. Reported: registry requests
//     that reached the mirror and wall time, for 10 pulls.
//   - stalled: the mirror accepts and never answers. Stock waits until the
//     caller gives up (stallDeadline per pull, as a kubelet's deadline or
//     CRI's image_pull_progress_timeout would); Pullwise, with
//     registry_response_timeout = 2s, pays that once. Wall time and failed
//     pulls, for 5 pulls.
func BenchmarkFailingMirror(b *testing.B) {
	const stallDeadline = 10 * time.Second
	for _, tc := range []struct {
		name  string
		pulls int
		fault registry.FaultFunc
	}{
		{"503", 10, func(registry.Request) *registry.Fault { return &registry.Fault{Status: 503} }},
		{"stalled", 5, func(registry.Request) *registry.Fault { return &registry.Fault{Delay: time.Hour} }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			stockBin := daemon.Bin("containerd-stock")
			if _, err := os.Stat(stockBin); err != nil {
				b.Fatalf("stock containerd missing (make bench builds it): %v", err)
			}
			pw := newEnv(b, envOptions{mirror: mirrorSeeded, extraConfig: healthConfig(0, 0, 2*time.Second, 0)})
			c := contenders{pullwise: pw, stock: pw.sibling(daemon.Options{Binary: stockBin, LogLevel: "info"})}
			wall := map[string]time.Duration{}
			requests, failed := map[string]int{}, map[string]int{}
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				pw.mirror.SetFault(nil)
				refs := make([]string, tc.pulls)
				for j := range refs {
					refs[j] = pw.push(fmt.Sprintf("bench/mirror-%s%d-%d", tc.name, i, j), "v1",
						registry.Image{Layers: []int64{1 << 20, 1 << 20}, Seed: int64(20000 + i*100 + j)}).Ref
				}
				pw.mirror.SetFault(tc.fault)
				b.StartTimer()
				c.each(b, i, func(name string, e *env) {
					e.mirror.Reset()
					start := time.Now()
					for _, ref := range refs {
						ctx, cancel := context.WithTimeout(context.Background(), stallDeadline)
						if _, err := e.images.PullImage(ctx, criImage(ref), nil, nil); err != nil {
							failed[name]++
						}
						cancel()
					}
					wall[name] += time.Since(start)
					requests[name] += e.mirror.Count(isContainerd)
				})
			}
			n := float64(b.N)
			for _, name := range []string{"stock", "pullwise"} {
				b.ReportMetric(wall[name].Seconds()/n, name+"-wall-s")
				b.ReportMetric(float64(requests[name])/n, name+"-mirror-requests")
				b.ReportMetric(float64(failed[name])/n, name+"-failed-pulls")
			}
			b.ReportMetric(float64(wall["pullwise"])/float64(wall["stock"]), "wall-ratio")
		})
	}
}
