package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pullwise/pullwise/integration/corpus"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// corpusImage is a corpus image as pushed: its layers' digests and sizes,
// for the link's bound.
type corpusImage struct {
	name   string
	image  v1.Image
	layers map[string]int64 // digest: compressed size
	bytes  int64
}

// buildCorpus builds the images of scenario, from the layer cache in
// PULLWISE_CORPUS_CACHE (default: the user's cache directory), which keeps
// them, and their digests, from one run to the next.
func buildCorpus(b *testing.B, scenario func(corpus.Trees) []corpus.Image) []corpusImage {
	cache := os.Getenv("PULLWISE_CORPUS_CACHE")
	if cache == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			b.Fatal(err)
		}
		cache = filepath.Join(dir, "pullwise", "corpus")
	}
	pause := filepath.Join(cache, "pause")
	if err := os.MkdirAll(pause, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pause, "pause"), daemon.PauseBinary(b), 0o755); err != nil {
		b.Fatal(err)
	}
	trees, err := corpus.LocalTrees(pause)
	if err != nil {
		b.Fatal(err)
	}
	var out []corpusImage
	for _, img := range scenario(trees) {
		built, err := corpus.Build(cache, img)
		if err != nil {
			b.Fatal(err)
		}
		ci := corpusImage{name: img.Name, image: built, layers: map[string]int64{}}
		layers, err := built.Layers()
		if err != nil {
			b.Fatal(err)
		}
		for _, l := range layers {
			d, err := l.Digest()
			if err != nil {
				b.Fatal(err)
			}
			size, err := l.Size()
			if err != nil {
				b.Fatal(err)
			}
			ci.layers[d.String()] = size
			ci.bytes += size
		}
		out = append(out, ci)
	}
	return out
}

// uniqueBytes is what pulling imgs moves over the link: each layer once.
func uniqueBytes(imgs []corpusImage) int64 {
	seen := map[string]bool{}
	var n int64
	for _, img := range imgs {
		for d, size := range img.layers {
			if !seen[d] {
				seen[d] = true
				n += size
			}
		}
	}
	return n
}

// clean removes refs from e and collects the garbage, so that the next
// burst pulls every layer again.
func (e *env) clean(b *testing.B, refs []string) {
	for _, ref := range refs {
		if err := e.images.RemoveImage(context.Background(), criImage(ref)); err != nil && status.Code(err) != codes.NotFound {
			b.Fatalf("remove %s: %v", ref, err)
		}
	}
	e.collectGarbage()
}

// resetPeakRSS starts containerd's peak resident memory afresh (Linux's
// clear_refs 5); peakRSS reads it (VmHWM) in bytes.
func resetPeakRSS(b *testing.B, d *daemon.Daemon) {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", d.PID()), []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
}

func peakRSS(b *testing.B, d *daemon.Daemon) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.PID()))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmHWM in /proc status")
	return 0
}

// benchProfiles are the network profiles to run: PULLWISE_BENCH_PROFILES,
// comma-separated, or both.
func benchProfiles() []string {
	if p := os.Getenv("PULLWISE_BENCH_PROFILES"); p != "" {
		return strings.Split(p, ",")
	}
	return []string{"loopback", "wan"}
}

// BenchmarkCorpusNodeBoot: what a node pulls as it boots (corpus.NodeBoot:
// the pause image and six system images of 19-38 MiB from real files,
// sharing a base layer), all at once through CRI, on Pullwise and on stock.
// Each figure is reported against its physical limit, the bound:
//   - on loopback, the CPU the burst takes (containerd's, the registry's
//     and the clients'), the least of the two daemons', spread over the
//     CPUs;
//   - on the WAN, the same, or the link if longer: each layer's bytes once
//     at registry.DefaultWAN's bandwidth, plus the four round trips of an
//     image's chain (resolve, manifest, config, layer);
//   - for the median, the same for the smallest images that make the
//     median, done first: the best order of the same work, each image's
//     share measured with one pull at a time on each daemon.
func BenchmarkCorpusNodeBoot(b *testing.B) {
	benchCorpus(b, "boot", corpus.NodeBoot)
}

// BenchmarkCorpusDeployBurst: a deployment landing on a node
// (corpus.DeployBurst: 12 application images of 92-177 MiB in 6 to 12
// layers, sharing a distribution base, one of two runtimes and a tools
// layer), all at once through CRI, against the same bounds.
func BenchmarkCorpusDeployBurst(b *testing.B) {
	benchCorpus(b, "deploy", corpus.DeployBurst)
}

func benchCorpus(b *testing.B, name string, scenario func(corpus.Trees) []corpus.Image) {
	imgs := buildCorpus(b, scenario)
	for _, profile := range benchProfiles() {
		b.Run(profile, func(b *testing.B) {
			c := newContenders(b, gateConfig(benchLimit, "0s"))
			host := c.pullwise.upstream.Host()
			if profile == "wan" {
				host = c.pullwise.upstream.ServeWAN(b, registry.DefaultWAN)
				c.pullwise.writeHostsFor(host, "http://"+host, "")
			}
			var refs []string
			for _, img := range imgs {
				repo := "corpus/" + name + "/" + img.name
				if _, err := c.pullwise.upstream.PushImage(context.Background(), repo, "v1", img.image); err != nil {
					b.Fatal(err)
				}
				refs = append(refs, host+"/"+repo+":v1")
			}

			// Each image's share of the work, alone: the least CPU either
			// daemon took for it (containerd's, the registry's, the
			// client's), with what it shares with the images before it
			// pulled already, as in a burst.
			work := make([]time.Duration, len(refs))
			for _, e := range []*env{c.stock, c.pullwise} {
				e.clean(b, refs)
				for i, ref := range refs {
					cpu0, own0 := e.d.CPUTime(b), ownCPU(b)
					if _, err := e.images.PullImage(context.Background(), criImage(ref), nil, nil); err != nil {
						b.Fatal(err)
					}
					used := e.d.CPUTime(b) - cpu0 + ownCPU(b) - own0
					if work[i] == 0 || used < work[i] {
						work[i] = used
					}
				}
			}

			med, span := map[string]time.Duration{}, map[string]time.Duration{}
			cpu, daemonCPU, peak := map[string]time.Duration{}, map[string]time.Duration{}, map[string]int64{}
			for i := 0; b.Loop(); i++ {
				c.each(i, func(name string, e *env) {
					b.StopTimer()
					e.clean(b, refs)
					syscall.Sync()
					c.evict(b)
					resetPeakRSS(b, e.d)
					b.StartTimer()
					cpu0, own0 := e.d.CPUTime(b), ownCPU(b)
					d := pullAll(b, e, refs)
					used := e.d.CPUTime(b) - cpu0
					daemonCPU[name] += used
					cpu[name] += used + ownCPU(b) - own0
					peak[name] = max(peak[name], peakRSS(b, e.d))
					if os.Getenv("PULLWISE_BENCH_VERBOSE") != "" {
						b.Logf("%s completions: %v", name, d)
					}
					med[name] += median(d)
					span[name] += d[len(d)-1]
				})
			}
			// No order of the burst's work beats the least CPU either
			// daemon spent on it, spread over every CPU.
			least := min(cpu["stock"], cpu["pullwise"]) / time.Duration(b.N)
			makespanBound, medianBound := corpusBounds(imgs, work, least, profile)
			n := float64(b.N)
			for _, who := range []string{"stock", "pullwise"} {
				b.ReportMetric(med[who].Seconds()/n, who+"-median-s")
				b.ReportMetric(span[who].Seconds()/n, who+"-makespan-s")
				b.ReportMetric(med[who].Seconds()/n/medianBound.Seconds(), who+"-median-vs-bound")
				b.ReportMetric(span[who].Seconds()/n/makespanBound.Seconds(), who+"-makespan-vs-bound")
				b.ReportMetric(daemonCPU[who].Seconds()/n, who+"-daemon-cpu-s")
				b.ReportMetric(float64(peak[who])/(1<<20), who+"-peak-rss-MiB")
			}
			b.ReportMetric(float64(med["pullwise"])/float64(med["stock"]), "median-ratio")
			b.ReportMetric(float64(span["pullwise"])/float64(span["stock"]), "makespan-ratio")
			b.ReportMetric(medianBound.Seconds(), "median-bound-s")
			b.ReportMetric(makespanBound.Seconds(), "makespan-bound-s")
		})
	}
}

// corpusBounds are the physical limits of pulling imgs at once: the
// burst's CPU (least) on every CPU, or on the WAN the link if that is
// longer; for the median, the share of that work (by work, each image's
// alone) of the images that make the median, smallest first.
func corpusBounds(imgs []corpusImage, work []time.Duration, least time.Duration, profile string) (makespan, median time.Duration) {
	order := make([]int, len(imgs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return int(imgs[a].bytes - imgs[b].bytes) })
	var all time.Duration
	for _, w := range work {
		all += w
	}
	bound := func(idx []int) time.Duration {
		var share time.Duration
		var some []corpusImage
		for _, i := range idx {
			share += work[i]
			some = append(some, imgs[i])
		}
		d := time.Duration(float64(least) * float64(share) / float64(all) / float64(runtime.NumCPU()))
		if profile == "wan" {
			w := registry.DefaultWAN
			link := time.Duration(float64(uniqueBytes(some))/float64(w.BytesPerSecond)*float64(time.Second)) + 4*w.Latency
			d = max(d, link)
		}
		return d
	}
	return bound(order), bound(order[:len(order)/2+1])
}
