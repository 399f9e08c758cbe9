package kubelet

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// What an operator sees: 20 static pods with 20 different images appear at
// once on a node, and each pod's time from its manifest being written to
// kubelet reporting it Running. Stock containerd (bin/containerd-stock,
// built from the same containerd module) and Pullwise with a node-wide pull
// limit run under the same kubelet configuration, one after the other, each
// on a fresh node, against one upstream registry: on loopback, then behind
// the WAN profile. docs/benchmarks.md has results.

const benchPods = 20

// benchPullwiseConfig is Pullwise's plugin TOML on the benchmarks' nodes.
func benchPullwiseConfig(t testing.TB) string {
	return fmt.Sprintf("[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  max_parallel_image_pulls = %d\n", daemon.Limit(t))
}

// podStarts holds each pod's time to Running, sorted.
type podStarts []time.Duration

func (p podStarts) first() time.Duration  { return p[0] }
func (p podStarts) median() time.Duration { return p[len(p)/2] }
func (p podStarts) last() time.Duration   { return p[len(p)-1] }

func BenchmarkKubeletPodStart(b *testing.B) {
	stockBin := daemon.Bin("containerd-stock")
	if _, err := os.Stat(stockBin); err != nil {
		b.Fatalf("stock containerd missing (make bench builds it): %v", err)
	}
	// One upstream for all runs, seeded once: images of 3 text-like
	// layers of 4 MiB (gzip for real, so unpacking costs CPU), plus the
	// /pause layer that makes them runnable.
	upstream := registry.Start(b, registry.Options{Name: "upstream"})
	var repos []string
	for i := range benchPods {
		repo := fmt.Sprintf("bench/pod%d", i)
		img := runnableImage(b, int64(5000+i), 4<<20, 4<<20, 4<<20)
		img.Compressible = true
		upstream.Push(b, repo, "v1", img)
		repos = append(repos, repo)
	}

	for _, prof := range daemon.Profiles(b) {
		b.Run(prof.Name, func(b *testing.B) {
			contenders := map[string]struct{ binary, config string }{
				"stock":    {stockBin, ""},
				"pullwise": {"", benchPullwiseConfig(b)},
			}
			results := map[string]podStarts{}
			for _, name := range daemon.Order(daemon.Burst(b)+prof.Index, "stock", "pullwise") {
				c := contenders[name]
				b.Run(name, func(b *testing.B) {
					var starts podStarts
					for b.Loop() {
						b.StopTimer()
						n := newNode(b, nodeOptions{
							binary: c.binary, pullwise: c.config, wan: prof.WAN,
							upstream: upstream, noMirror: true, prePullPause: true,
							// kubelet's own pull rate limit (5/s, burst 10)
							// refuses 20 pulls at once with "pull QPS
							// exceeded" and a 10 s back-off, which would
							// hide the runtimes behind it; lifted for both.
							kubelet: Options{Config: map[string]any{"registryPullQPS": 0}},
						})
						b.StartTimer()
						var images []string
						for _, repo := range repos {
							images = append(images, n.upHost+"/"+repo+":v1")
						}
						starts = sorted(startPods(b, n, images))
					}
					results[name] = starts
					b.ReportMetric(starts.first().Seconds(), "first-s")
					b.ReportMetric(starts.median().Seconds(), "median-s")
					b.ReportMetric(starts.last().Seconds(), "last-s")
					daemon.Verbosef(b, "%s: pods Running after %v", name, starts)
					// The second contender reports the ratios.
					s, p := results["stock"], results["pullwise"]
					if s == nil || p == nil {
						return
					}
					ratio := func(f func(podStarts) time.Duration) float64 { return float64(f(p)) / float64(f(s)) }
					b.ReportMetric(ratio(podStarts.first), "first-ratio")
					b.ReportMetric(ratio(podStarts.median), "median-ratio")
					b.ReportMetric(ratio(podStarts.last), "last-ratio")
					b.Logf("%s, %d pods, max_parallel_image_pulls=%d: stock first/median/last %.2f/%.2f/%.2f s, pullwise %.2f/%.2f/%.2f s; pullwise/stock first %.2f median %.2f last %.2f",
						prof.Name, benchPods, daemon.Limit(b),
						s.first().Seconds(), s.median().Seconds(), s.last().Seconds(),
						p.first().Seconds(), p.median().Seconds(), p.last().Seconds(),
						ratio(podStarts.first), ratio(podStarts.median), ratio(podStarts.last))
				})
			}
		})
	}
}

// startPods writes one static pod per image at once and returns each
// pod's time from then to Running in kubelet's /pods, by index.
func startPods(b *testing.B, n *node, images []string) []time.Duration {
	names := make([]string, len(images))
	for i := range images {
		names[i] = fmt.Sprintf("bench%d", i)
	}
	start := time.Now()
	for i, image := range images {
		n.k.WritePod(b, StaticPod{Name: names[i], Image: image})
	}
	running := make([]time.Duration, len(names))
	left := len(names)
	deadline := start.Add(10 * time.Minute)
	for left > 0 {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d pods Running after 10 minutes", len(names)-left, len(names))
		}
		pods, err := n.k.Pods()
		if err != nil {
			b.Fatal(err)
		}
		now := time.Since(start)
		for _, p := range pods {
			i := slices.Index(names, strings.TrimSuffix(p.Metadata.Name, "-"+NodeName))
			if i >= 0 && running[i] == 0 && Running(p) {
				running[i] = now
				left--
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return running
}

// sorted is starts from shortest to longest.
func sorted(starts []time.Duration) podStarts {
	return slices.Sorted(slices.Values(starts))
}
