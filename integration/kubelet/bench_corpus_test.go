package kubelet

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/corpus"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// The corpus scenarios (integration/corpus) as pods under a real kubelet:
// one static pod per image, all written at once. Each runtime runs them
// twice, each time on a fresh node: first with every image already pulled
// (the floor: sandbox and container creation, which no pull layer
// changes), then cold. A pod's pull delay is its time to Running minus
// the floor's at the same rank, so the figure that compares the runtimes'
// pulling is not drowned by the pod start both share.
//
// PULLWISE_BENCH_PROFILE and PULLWISE_BENCH_TRACE (file prefixes) take a
// CPU profile and an execution trace of each containerd from the start
// of its cold run, to prefix.scenario.runtime.profile.burst (the CRI
// benchmarks' are prefix.runtime.profile.burst).

// BenchmarkKubeletCorpusNodeBoot: the pause image and six system images
// of 19-38 MiB sharing a base layer (corpus.NodeBoot), as a booting node's
// pods.
func BenchmarkKubeletCorpusNodeBoot(b *testing.B) {
	benchKubeletCorpus(b, "boot", corpus.NodeBoot)
}

// BenchmarkKubeletCorpusBigAndSmall: one pod of an image of 1.5 GiB or
// more written first, with ten small pods (corpus.BigAndSmall). It also
// reports the small pods' median and the big pod's time.
func BenchmarkKubeletCorpusBigAndSmall(b *testing.B) {
	benchKubeletCorpus(b, "bigsmall", corpus.BigAndSmall)
}

// BenchmarkKubeletCorpusDeployBurst: twelve application pods of 92-177
// MiB images sharing base layers (corpus.DeployBurst).
func BenchmarkKubeletCorpusDeployBurst(b *testing.B) {
	benchKubeletCorpus(b, "deploy", corpus.DeployBurst)
}

// corpusRun is one runtime's pod starts, by pod, with its floor's, and
// its containerd's CPU time, peak resident memory and page faults over
// the cold start.
type corpusRun struct {
	cold, floor []time.Duration
	cpu         time.Duration
	peakRSS     int64
	faults      int64
	// stall is how long some task on the node waited for a CPU and for
	// the disk over the cold start, whoever's task it was.
	stall daemon.Stall
	// written is how long Pullwise's write turns were held in the cold
	// run (transfer/commits): the pulls' writes to the metadata database
	// go one at a time, so the pulls took at least that long.
	written time.Duration
}

// delay is the pull delay at each rank: the cold start minus the floor's.
func (r corpusRun) delay() podStarts {
	c, f := sorted(r.cold), sorted(r.floor)
	d := make(podStarts, len(c))
	for i := range c {
		d[i] = c[i] - f[i]
	}
	return d
}

func benchKubeletCorpus(b *testing.B, scenarioName string, scenario func(corpus.Trees) []corpus.Image) {
	// go test repeats each leaf benchmark -count times in a row: here
	// each runtime's floor, then its cold run, so that the ratios would
	// pair the last run of each, not runs side by side.
	if n := flag.Lookup("test.count").Value.String(); n != "1" {
		b.Fatalf("-count %s: the kubelet corpus runs one set per process; run the process again for another, with PULLWISE_BENCH_BURST=1, 2, ... to go on through the orders", n)
	}
	burst := daemon.Burst(b)
	stockBin := daemon.Bin("containerd-stock")
	if _, err := os.Stat(stockBin); err != nil {
		b.Fatalf("stock containerd missing (make bench builds it): %v", err)
	}
	imgs, err := corpus.Load(daemon.PauseBinary(b), scenario)
	if err != nil {
		b.Fatal(err)
	}
	bigFirst := imgs[0].Name == "big"
	upstream := registry.Start(b, registry.Options{Name: "upstream"})
	var repos []string
	for _, img := range imgs {
		repo := "corpus/" + scenarioName + "/" + img.Name
		if _, err := upstream.PushImage(context.Background(), repo, "v1", img.Image); err != nil {
			b.Fatal(err)
		}
		repos = append(repos, repo)
	}
	for _, prof := range daemon.Profiles(b) {
		b.Run(prof.Name, func(b *testing.B) {
			// PULLWISE_BENCH_TRANSFER is TOML for Pullwise's transfer
			// plugin, as in ./integration's benchmarks.
			type contender struct{ binary, config, transfer string }
			contenders := map[string]contender{
				"stock":    {stockBin, "", ""},
				"pullwise": {"", benchPullwiseConfig(b), daemon.Transfer()},
			}
			names := []string{"stock", "pullwise"}
			if daemon.Noise() {
				contenders["again"] = contenders["stock"]
				names = append(names, "again")
			}
			runs := map[string]*corpusRun{}
			// The WAN takes the order three on from loopback's: two
			// runtimes start opposite each other within a process, and
			// with three, processes 0-2 put each first once on each
			// profile and 0-5 go through all six orders.
			for _, name := range daemon.Order(burst+3*prof.Index, names...) {
				c := contenders[name]
				run := &corpusRun{}
				runs[name] = run
				start := func(b *testing.B, prePull bool) []time.Duration {
					n := newNode(b, nodeOptions{
						binary: c.binary, pullwise: c.config, transfer: c.transfer, wan: prof.WAN,
						upstream: upstream, noMirror: true, prePullPause: true,
						// As in BenchmarkKubeletPodStart: kubelet's own pull
						// rate limit would refuse a burst this size.
						kubelet: Options{Config: map[string]any{"registryPullQPS": 0}},
					})
					var refs []string
					for _, repo := range repos {
						refs = append(refs, n.upHost+"/"+repo+":v1")
					}
					if prePull {
						for _, ref := range refs {
							ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
							_, err := n.img.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: ref}})
							cancel()
							if err != nil {
								b.Fatalf("pre-pull %s: %v", ref, err)
							}
						}
					}
					// As the CRI bursts do: what the last node wrote is on
					// disk, so that its writeback does not slow this one.
					syscall.Sync()
					// Containerd's CPU, memory and profiles: of the cold run.
					var used0 daemon.Usage
					var stall0 daemon.Stall
					var written0 time.Duration
					if !prePull {
						// Scraped outside the CPU counted for the run.
						if name == "pullwise" {
							written0 = n.d.WriteTime(b)
						}
						n.d.ResetPeakRSS(b)
						used0 = n.d.Usage(b)
						stall0 = daemon.NodeStall(b)
						defer n.d.ProfileAsked(b, fmt.Sprintf("%s.%s.%s.%d", scenarioName, name, prof.Name, burst))()
					}
					starts := startPods(b, n, refs)
					if !prePull {
						used := n.d.Usage(b)
						run.stall = daemon.NodeStall(b).Sub(stall0)
						run.cpu, run.faults = used.CPU-used0.CPU, used.PageFaults-used0.PageFaults
						run.peakRSS = n.d.PeakRSS(b)
						if name == "pullwise" {
							run.written = n.d.WriteTime(b) - written0
						}
					}
					if daemon.Verbose() {
						// Where each pull's time went (Pullwise logs it), to
						// stderr: a benchmark's log is cut after ten lines.
						printTimelines(prof.Name+" "+name, prePull, n.d.Log())
					}
					return starts
				}
				// Each on its own node, torn down at the end of its
				// sub-benchmark, as only one kubelet runs at a time.
				b.Run(name+"/floor", func(b *testing.B) {
					for b.Loop() {
						run.floor = start(b, true)
					}
				})
				b.Run(name+"/cold", func(b *testing.B) {
					for b.Loop() {
						run.cold = start(b, false)
					}
					logCorpusRun(b, prof.Name+" "+name, run, bigFirst)
				})
			}
			// On a row of their own, whichever runtime went last, as only
			// a benchmark without sub-benchmarks prints metrics.
			// The burst is described there too, once per profile.
			b.Run("ratios", func(b *testing.B) {
				corpus.Describe(b, imgs)
				reportCorpusRatios(b, runs, bigFirst)
			})
		})
	}
}

// printTimelines prints where each pod's time went to stderr: a
// benchmark's log is cut after ten lines. CRI's own lines, which stock
// logs as well, give each call's start and end (sandbox, pull, create,
// start), split by pod (criCallTable), so that a pod's start can be
// split into its pull and the rest on either runtime; Pullwise's timeline
// says where a pull's time went. With PULLWISE_BENCH_VERBOSE=debug each
// layer's too: its wait for an unpack place, its pauses, and
// containerd's own time applying it.
func printTimelines(who string, prePull bool, log string) {
	run := "cold"
	if prePull {
		run = "floor"
	}
	fmt.Fprintf(os.Stderr, "=== timelines of %s %s\n", who, run)
	for _, line := range strings.Split(log, "\n") {
		if daemon.TimelineLine(line) {
			fmt.Fprintln(os.Stderr, line)
		}
	}
	fmt.Fprint(os.Stderr, criCallTable(log))
}

func logCorpusRun(b *testing.B, who string, run *corpusRun, bigFirst bool) {
	cold, floor, delay := sorted(run.cold), sorted(run.floor), run.delay()
	b.Logf("%s: Running first/median/last %.2f/%.2f/%.2f s, floor %.2f/%.2f/%.2f s, pull delay %.2f/%.2f/%.2f s",
		who, cold.first().Seconds(), cold.median().Seconds(), cold.last().Seconds(),
		floor.first().Seconds(), floor.median().Seconds(), floor.last().Seconds(),
		delay.first().Seconds(), delay.median().Seconds(), delay.last().Seconds())
	if bigFirst {
		b.Logf("%s: big pod Running %.2f s (floor %.2f), small pods' median %.2f s (floor %.2f)", who,
			run.cold[0].Seconds(), run.floor[0].Seconds(), sorted(run.cold[1:]).median().Seconds(), sorted(run.floor[1:]).median().Seconds())
	}
	daemon.Verbosef(b, "%s: pods Running after %v, by pod; floor %v", who, run.cold, run.floor)
	daemon.Verbosef(b, "%s: some task on the node waited %v for a CPU, %v for the disk", who, run.stall.CPU.Round(time.Millisecond), run.stall.IO.Round(time.Millisecond))
}

// reportCorpusRatios reports Pullwise's figures over stock's as
// <figure>-ratio, and with a second stock ("again") its figures over the
// first's as <figure>-noise-ratio; each runtime's containerd CPU and peak
// RSS over its cold start as the CRI bursts name them; nothing when a
// runtime's runs were left out (-bench).
func reportCorpusRatios(b *testing.B, runs map[string]*corpusRun, bigFirst bool) {
	for _, r := range runs {
		if r.cold == nil || r.floor == nil {
			return
		}
	}
	s, p, again := runs["stock"], runs["pullwise"], runs["again"]
	if s == nil || p == nil {
		return
	}
	ratio := func(figure string, f func(podStarts) time.Duration, of func(*corpusRun) podStarts) {
		b.ReportMetric(float64(f(of(p)))/float64(f(of(s))), figure+"-ratio")
		if again != nil {
			b.ReportMetric(float64(f(of(again)))/float64(f(of(s))), figure+"-noise-ratio")
		}
	}
	cold := func(r *corpusRun) podStarts { return sorted(r.cold) }
	floor := func(r *corpusRun) podStarts { return sorted(r.floor) }
	ratio("first", podStarts.first, cold)
	ratio("median", podStarts.median, cold)
	ratio("last", podStarts.last, cold)
	ratio("delay-first", podStarts.first, (*corpusRun).delay)
	ratio("delay-median", podStarts.median, (*corpusRun).delay)
	ratio("delay-last", podStarts.last, (*corpusRun).delay)
	ratio("floor-median", podStarts.median, floor)
	for who, r := range runs {
		b.ReportMetric(sorted(r.cold).median().Seconds(), who+"-median-s")
		b.ReportMetric(sorted(r.floor).median().Seconds(), who+"-floor-median-s")
		b.ReportMetric(r.delay().median().Seconds(), who+"-delay-median-s")
		b.ReportMetric(r.cpu.Seconds(), who+"-daemon-cpu-s")
		b.ReportMetric(float64(r.peakRSS)/(1<<20), who+"-peak-rss-MiB")
		b.ReportMetric(float64(r.faults), who+"-page-faults")
		b.ReportMetric(r.stall.CPU.Seconds(), who+"-cpu-stall-s")
		b.ReportMetric(r.stall.IO.Seconds(), who+"-io-stall-s")
	}
	// The write floor against Pullwise's last pod: how much of the burst
	// its pulls' writes alone took.
	b.ReportMetric(p.written.Seconds(), "pullwise-write-s")
	b.ReportMetric(p.written.Seconds()/sorted(p.cold).last().Seconds(), "pullwise-write-share")
	if bigFirst {
		small := func(r *corpusRun) podStarts { return sorted(r.cold[1:]) }
		big := func(r *corpusRun) podStarts { return podStarts{r.cold[0]} }
		ratio("small-median", podStarts.median, small)
		ratio("big", podStarts.first, big)
	}
}
