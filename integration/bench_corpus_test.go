package integration

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pullwise/pullwise/integration/corpus"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// buildCorpus builds the images of scenario, from the layer cache that
// keeps them, and their digests, from one run to the next.
func buildCorpus(b *testing.B, scenario func(corpus.Trees) []corpus.Image) []corpus.Built {
	imgs, err := corpus.Load(daemon.PauseBinary(b), scenario)
	if err != nil {
		b.Fatal(err)
	}
	return imgs
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

// byImage pairs each image's name and size on the wire with its time, in
// the order of imgs.
func byImage(imgs []corpus.Built, times []time.Duration) string {
	out := make([]string, len(times))
	for i, d := range times {
		out[i] = fmt.Sprintf("%s (%d MiB) %.2fs", imgs[i].Name, imgs[i].Bytes>>20, d.Seconds())
	}
	return strings.Join(out, ", ")
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
//     share measured with one pull at a time on each daemon;
//   - for the first completion, the smallest image's share alone.
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

// BenchmarkCorpusBigAndSmall: one image of 1.5 GiB or more, its largest
// layer over 500 MiB, asked for first and at once with ten small images
// (corpus.BigAndSmall). Besides the burst's figures it reports the small
// images' median and the big image's time, each against its bound: the
// small images' work smallest first, and the big image's own.
func BenchmarkCorpusBigAndSmall(b *testing.B) {
	benchCorpus(b, "bigsmall", corpus.BigAndSmall)
}

// corpusRuns counts the corpus bursts of this process, so that with
// -count the daemons take turns going first, as they do within a run.
var corpusRuns int

func benchCorpus(b *testing.B, name string, scenario func(corpus.Trees) []corpus.Image) {
	imgs := buildCorpus(b, scenario)
	// In the big-and-small scenario the first image is the big one.
	bigFirst := imgs[0].Name == "big"
	for _, prof := range daemon.Profiles(b) {
		profile := prof.Name
		b.Run(profile, func(b *testing.B) {
			limit := daemon.Limit(b)
			c := newContenders(b, gateConfig(limit, "0s"))
			if daemon.Noise() {
				c = c.withNoise()
			}
			host := c.pullwise.upstream.Host()
			if prof.WAN != nil {
				host = c.pullwise.upstream.ServeWAN(b, *prof.WAN)
				c.pullwise.writeHostsFor(host, "http://"+host, "")
			}
			corpus.Describe(b, imgs)
			var refs []string
			for _, img := range imgs {
				repo := "corpus/" + name + "/" + img.Name
				if _, err := c.pullwise.upstream.PushImage(context.Background(), repo, "v1", img.Image); err != nil {
					b.Fatal(err)
				}
				refs = append(refs, host+"/"+repo+":v1")
			}
			if i := slices.IndexFunc(imgs, func(img corpus.Built) bool { return img.Name == "pause" }); i >= 0 {
				c.pinSandbox(b, refs[i], gateConfig(limit, "0s"))
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

			first, med, span := map[string]time.Duration{}, map[string]time.Duration{}, map[string]time.Duration{}
			smallMed, big := map[string]time.Duration{}, map[string]time.Duration{}
			cpu, daemonCPU, peak := map[string]time.Duration{}, map[string]time.Duration{}, map[string]int64{}
			faults := map[string]int64{}
			// written is how long Pullwise's write turns were held, for
			// the write floor.
			var written time.Duration
			var ran []string // the daemons, in the order the last burst ran them
			for b.Loop() {
				ran = ran[:0]
				c.each(b, corpusRuns, func(name string, e *env) {
					ran = append(ran, name)
					b.StopTimer()
					e.clean(b, refs)
					syscall.Sync()
					c.evict(b)
					e.d.ResetPeakRSS(b)
					// Scraped outside the CPU counted for the burst and its
					// bound, and of Pullwise alone: stock has no turns.
					var written0 time.Duration
					if name == "pullwise" {
						written0 = e.d.WriteTime(e.t)
					}
					b.StartTimer()
					profiled := profileBurst(b, e, name, profile, corpusRuns)
					used0, own0 := e.d.Usage(b), ownCPU(b)
					each := pullEach(b, e, refs)
					usage := e.d.Usage(b)
					used := usage.CPU - used0.CPU
					faults[name] += usage.PageFaults - used0.PageFaults
					profiled()
					daemonCPU[name] += used
					cpu[name] += used + ownCPU(b) - own0
					if name == "pullwise" {
						written += e.d.WriteTime(e.t) - written0
					}
					peak[name] = max(peak[name], e.d.PeakRSS(b))
					daemon.Verbosef(b, "%s completions, in the order asked: %s", name, byImage(imgs, each))
					d := slices.Sorted(slices.Values(each))
					first[name] += d[0]
					med[name] += median(d)
					span[name] += d[len(d)-1]
					if bigFirst {
						big[name] += each[0]
						smallMed[name] += median(slices.Sorted(slices.Values(each[1:])))
					}
				})
				corpusRuns++
			}
			writeTimelines(b, c.pullwise.d)
			// No order of the burst's work beats the least CPU either
			// daemon spent on it, spread over every CPU.
			least := min(cpu["stock"], cpu["pullwise"]) / time.Duration(b.N)
			bounds := bounds{imgs: imgs, work: work, least: least, wan: prof.WAN}
			all := indexes(len(imgs))
			makespanBound, medianBound := bounds.of(all), bounds.median(all)
			n := float64(b.N)
			report := func(what string, d map[string]time.Duration, bound time.Duration) {
				for _, who := range []string{"stock", "pullwise"} {
					b.ReportMetric(d[who].Seconds()/n, who+"-"+what+"-s")
					b.ReportMetric(d[who].Seconds()/n/bound.Seconds(), who+"-"+what+"-vs-bound")
				}
				b.ReportMetric(float64(d["pullwise"])/float64(d["stock"]), what+"-ratio")
				if c.again != nil {
					b.ReportMetric(float64(d["again"])/float64(d["stock"]), what+"-noise-ratio")
				}
				b.ReportMetric(bound.Seconds(), what+"-bound-s")
			}
			// The first completion's bound is the smallest image's alone.
			smallest := slices.MinFunc(all, func(a, b int) int { return int(imgs[a].Bytes - imgs[b].Bytes) })
			report("first", first, bounds.of([]int{smallest}))
			report("median", med, medianBound)
			report("makespan", span, makespanBound)
			if bigFirst {
				report("small-median", smallMed, bounds.median(all[1:]))
				report("big", big, bounds.of(all[:1]))
			}
			names, _ := c.all()
			for _, who := range names {
				b.ReportMetric(daemonCPU[who].Seconds()/n, who+"-daemon-cpu-s")
				b.ReportMetric(float64(peak[who])/(1<<20), who+"-peak-rss-MiB")
				b.ReportMetric(float64(faults[who])/n, who+"-page-faults")
			}
			// Where each daemon ran, 1 first: hack/benchtable's order
			// column, as a burst's figures are read against its place in
			// the run. Of one burst only: over more, the order moves on
			// with each.
			if b.N == 1 {
				for i, who := range ran {
					b.ReportMetric(float64(i+1), who+"-place")
				}
			}
			// The pulls' write turns are held one at a time, so the burst
			// cannot be shorter than their time, and its share of the
			// makespan says how much of the burst waited on the database
			// ("The write floor" in docs/benchmarks.md). Stock makes the
			// same writes but does not count them.
			b.ReportMetric(written.Seconds()/n, "pullwise-write-s")
			b.ReportMetric(float64(written)/float64(span["pullwise"]), "pullwise-write-share")
		})
	}
}

func indexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// bounds are the physical limits of pulling some of a burst's images:
// their share of the burst's CPU (least, by each image's work alone) on
// every CPU, or on the WAN their bytes over the link if that is longer.
type bounds struct {
	imgs  []corpus.Built
	work  []time.Duration
	least time.Duration
	wan   *registry.WAN // nil on loopback
}

// of is the bound for the images idx, done alone.
func (bd bounds) of(idx []int) time.Duration {
	var all, share time.Duration
	for _, w := range bd.work {
		all += w
	}
	var some []corpus.Built
	for _, i := range idx {
		share += bd.work[i]
		some = append(some, bd.imgs[i])
	}
	d := time.Duration(float64(bd.least) * float64(share) / float64(all) / float64(runtime.NumCPU()))
	if w := bd.wan; w != nil {
		link := time.Duration(float64(corpus.UniqueBytes(some))/float64(w.BytesPerSecond)*float64(time.Second)) + 4*w.Latency
		d = max(d, link)
	}
	return d
}

// median is the bound for the median of idx: the best order of the same
// work, smallest first, to the image that makes the median.
func (bd bounds) median(idx []int) time.Duration {
	order := slices.Clone(idx)
	slices.SortFunc(order, func(a, b int) int { return int(bd.imgs[a].Bytes - bd.imgs[b].Bytes) })
	return bd.of(order[:len(order)/2+1])
}
