package integration

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// Benchmarks run Pullwise and a stock containerd built from the same
// containerd module side by side, on one registry, and report both and
// their ratio. `make bench` runs them; docs/benchmarks.md has results.

type contenders struct {
	stock, pullwise *env
	// again is a second stock daemon, started by withNoise: stock's time
	// over its own in the same run is how far a ratio to stock moves with
	// nothing changed, the noise a Pullwise/stock ratio is judged against.
	again *env
	// criImages is the CRI image plugin TOML the daemons run with.
	criImages string
}

// withNoise starts c's second stock daemon, configured as c.stock.
func (c contenders) withNoise() contenders {
	c.again = stockBeside(c.pullwise, c.criImages)
	return c
}

// stockBeside starts stock containerd on pw's registries and hosts.toml,
// with criImages for CRI's image plugin.
func stockBeside(pw *env, criImages string) *env {
	return pw.sibling(daemon.Options{Binary: daemon.Bin("containerd-stock"), LogLevel: daemon.LogLevel(), CRIImages: criImages,
		Transfer: daemon.StockTransfer()})
}

// all are c's daemons by name, in the order burst 0 runs them.
func (c contenders) all() (names []string, envs map[string]*env) {
	names, envs = []string{"stock", "pullwise"}, map[string]*env{"stock": c.stock, "pullwise": c.pullwise}
	if c.again != nil {
		names, envs["again"] = append(names, "again"), c.again
	}
	return names, envs
}

func newContenders(b *testing.B, pullwiseConfig string) contenders {
	return newContendersWith(b, pullwiseConfig, "")
}

// newContendersWith gives both daemons criImages, TOML for CRI's image
// plugin (such as discard_unpacked_layers).
func newContendersWith(b *testing.B, pullwiseConfig, criImages string) contenders {
	stockBin := daemon.Bin("containerd-stock")
	if _, err := os.Stat(stockBin); err != nil {
		b.Fatalf("stock containerd missing (make bench builds it): %v", err)
	}
	// Both at info (daemon.LogLevel): debug logging costs CPU that the
	// pulls compete for.
	// PULLWISE_BENCH_TRANSFER is TOML for Pullwise's transfer plugin
	// (max_concurrent_unpacks = 2, say), PULLWISE_BENCH_STOCK_TRANSFER the
	// same for stock: to measure a setting against stock at its defaults,
	// or both with it.
	pw := newEnv(b, envOptions{extraConfig: pullwiseConfig, criImages: criImages, transfer: daemon.Transfer(), logLevel: daemon.LogLevel()})
	return contenders{stock: stockBeside(pw, criImages), pullwise: pw, criImages: criImages}
}

// pinSandbox restarts both daemons with ref as CRI's sandbox image
// (pinned_images.sandbox), as every node is configured: the pause image a
// node pulls at boot is its sandbox image, which Pullwise's gate lets by
// (queue_bypass). Removal stays allowed, as a burst starts from no image.
func (c *contenders) pinSandbox(b *testing.B, ref, pullwiseConfig string) {
	b.Helper()
	pinned := fmt.Sprintf("  [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n    sandbox = %q\n", ref)
	// A second stock daemon started after this one (withNoise) is
	// configured as these.
	c.criImages = pinned
	c.pullwise.restartWith(b, envOptions{extraConfig: pullwiseConfig + "  protect_pinned_images = false\n", criImages: pinned,
		transfer: daemon.Transfer(), logLevel: daemon.LogLevel()})
	for _, e := range []*env{c.stock, c.again} {
		if e != nil {
			e.restartWith(b, envOptions{criImages: pinned, transfer: daemon.StockTransfer(), logLevel: daemon.LogLevel(),
				binary: daemon.Bin("containerd-stock")})
		}
	}
}

// pullAll pulls refs concurrently through CRI and returns each pull's
// completion time from the common start, sorted, and the makespan.
func pullAll(b *testing.B, e *env, refs []string) []time.Duration {
	done := pullEach(b, e, refs)
	slices.Sort(done)
	return done
}

// pullEach pulls refs concurrently through CRI, asked for in order, and
// returns each one's time to done, by index.
func pullEach(b *testing.B, e *env, refs []string) []time.Duration {
	ctx := context.Background()
	done := make([]time.Duration, len(refs))
	var wg sync.WaitGroup
	start := time.Now()
	for i, ref := range refs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.images.PullImage(ctx, criImage(ref), nil, nil); err != nil {
				b.Error(err)
			}
			done[i] = time.Since(start)
		}()
	}
	wg.Wait()
	return done
}

func median(d []time.Duration) time.Duration { return d[len(d)/2] }

// ownCPU is the CPU time this process has used: the registries and the
// clients of a benchmark.
func ownCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// evict drops from the page cache what both daemons have written, once
// it is on disk (after a sync). Each burst then writes into pages the
// last one freed. Left cached, every burst takes pages the machine has
// never used: on a VM whose host backs guest memory lazily, as this
// benchmark's does, writing 500 MiB took 1.3-2.0 s of system time that way
// against 0.15 s into pages just freed (dd, one 2 vCPU KVM guest), a cost
// that grows with each burst's place in the run and that neither daemon
// controls.
func (c contenders) evict(b *testing.B) {
	_, envs := c.all()
	for _, e := range envs {
		err := filepath.WalkDir(e.d.Root, func(path string, d fs.DirEntry, err error) error {
			// containerd's GC may remove a file the walk has listed
			// (discarded layers, for one): it needs no evicting.
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			f, err := os.Open(path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			defer f.Close()
			return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		})
		if err != nil {
			b.Fatalf("evict %s from the page cache: %v", e.d.Root, err)
		}
	}
}

// profileBurst starts what PULLWISE_BENCH_PROFILE and
// PULLWISE_BENCH_TRACE ask of e's daemon for the i-th burst of this
// process, which starts now, written to prefix.name.profile.burst, burst
// counted on from daemon.Burst; the func it returns waits for them.
func profileBurst(b *testing.B, e *env, name, profile string, i int) (wait func()) {
	return e.d.ProfileAsked(b, fmt.Sprintf("%s.%s.%d", name, profile, daemon.Burst(b)+i))
}

// each runs fn for every contender, in the order daemon.Order gives the
// i-th burst of this process, offset by the process's number in a set
// (daemon.Burst): with one burst per process (-count=1, -benchtime 1x),
// process k runs burst k's order.
func (c contenders) each(b *testing.B, i int, fn func(name string, e *env)) {
	names, envs := c.all()
	for _, name := range daemon.Order(daemon.Burst(b)+i, names...) {
		fn(name, envs[name])
	}
}

// BenchmarkDifferentImages: 20 concurrent pulls of 20 different images of
// 5 layers, both daemons at their defaults (max_concurrent_downloads 3 for
// stock, 6 for Pullwise), Pullwise with max_parallel_image_pulls. Two
// network profiles:
//   - loopback: the registry as fast as the machine, so unpacking on its
//     CPUs and disk is what limits;
//   - wan: registry.DefaultWAN, 20 ms per request and one 64 MiB/s budget
//     shared by every response, like a node's link.
//
// The first pods should get their images early (median-ratio) without the
// last one getting it later (makespan-ratio). PULLWISE_BENCH_VERBOSE=1 logs
// every completion; PULLWISE_BENCH_TIMELINES=file appends Pullwise's
// per-pull timelines to file (go test keeps only ten lines of a
// benchmark's log);
// PULLWISE_BENCH_PROFILE=prefix writes a CPU profile of each containerd
// from the start of each burst to prefix.{stock,pullwise}.profile.iteration:
// PULLWISE_BENCH_PROFILE_SECONDS long (2 by default). To compare where the
// two daemons spend a whole burst, make it longer than the slower burst.
// PULLWISE_BENCH_TRACE=prefix writes execution traces (go tool trace) the
// same way.
func BenchmarkDifferentImages(b *testing.B) {
	benchBurst(b, "diff", "", differentImage)
}

func differentImage(int) registry.Image {
	return registry.Image{Layers: []int64{4 << 20, 4 << 20, 4 << 20, 4 << 20, 4 << 20}, Compressible: true}
}

// BenchmarkDifferentImagesDiscard: BenchmarkDifferentImages with CRI's
// discard_unpacked_layers on both daemons, as EKS, GKE and Talos ship it.
// Stock then pulls on its local path (client.Pull); Pullwise through its
// transfer service, served by the cri-pull interceptor.
func BenchmarkDifferentImagesDiscard(b *testing.B) {
	benchBurst(b, "discard", "  discard_unpacked_layers = true\n", differentImage)
}

// BenchmarkMixedImages: as BenchmarkDifferentImages, but every fourth
// image is large (5 × 16 MiB) and the others small (one 4 MiB layer), as a
// node pulls an application image beside its sidecars. Stock shares the
// node between all pulls, so the small ones finish early on their own; a
// FIFO queue makes a small pull wait behind large ones asked for before it.
func BenchmarkMixedImages(b *testing.B) {
	benchBurst(b, "mixed", "", func(j int) registry.Image {
		if j%4 == 0 {
			return registry.Image{Layers: []int64{16 << 20, 16 << 20, 16 << 20, 16 << 20, 16 << 20}, Compressible: true}
		}
		return registry.Image{Layers: []int64{4 << 20}, Compressible: true}
	})
}

// BenchmarkManyLayers: as BenchmarkDifferentImages, but every image has
// 16 small layers (256 KiB each), so the work per layer that does not
// depend on its bytes (snapshots prepared and committed, in parallel
// unpack a rebase and a mount per layer, a request per blob) weighs more
// than inflating and writing.
func BenchmarkManyLayers(b *testing.B) {
	benchBurst(b, "layers", "", func(int) registry.Image {
		layers := make([]int64, 16)
		for i := range layers {
			layers[i] = 256 << 10
		}
		return registry.Image{Layers: layers, Compressible: true}
	})
}

// benchBurst pulls 20 images, image(j) the j-th, concurrently on both
// daemons (both with criImages for CRI's image plugin), on both network
// profiles, and reports the ratios.
func benchBurst(b *testing.B, name, criImages string, image func(j int) registry.Image) {
	const pulls = 20
	for _, prof := range daemon.Profiles(b) {
		b.Run(prof.Name, func(b *testing.B) {
			c := newContendersWith(b, gateConfig(daemon.Limit(b), "0s"), criImages)
			host := c.pullwise.upstream.Host()
			if prof.WAN != nil {
				host = c.pullwise.upstream.ServeWAN(b, *prof.WAN)
				c.pullwise.writeHostsFor(host, "http://"+host, "")
			}
			var med, span = map[string]time.Duration{}, map[string]time.Duration{}
			var cpu, daemonCPU = map[string]time.Duration{}, map[string]time.Duration{}
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				var refs []string
				for j := range pulls {
					repo := fmt.Sprintf("bench/%s%d-%d", name, i, j)
					img := image(j)
					img.Seed = int64(10000 + i*100 + j)
					c.pullwise.upstream.Push(b, repo, "v1", img)
					refs = append(refs, host+"/"+repo+":v1")
				}
				b.StartTimer()
				c.each(b, i, func(name string, e *env) {
					// Each burst starts with no dirty pages left by the
					// one before, whichever daemon wrote them: writeback
					// and the journal commits that content fsyncs force
					// would otherwise land on whoever pulls next.
					b.StopTimer()
					syscall.Sync()
					c.evict(b)
					b.StartTimer()
					profiled := profileBurst(b, e, name, prof.Name, i)
					cpu0, own0 := e.d.CPUTime(b), ownCPU(b)
					d := pullAll(b, e, refs)
					used := e.d.CPUTime(b) - cpu0
					daemonCPU[name] += used
					cpu[name] += used + ownCPU(b) - own0
					profiled()
					daemon.Verbosef(b, "%s completions: %v", name, d)
					med[name] += median(d)
					span[name] += d[len(d)-1]
				})
			}
			writeTimelines(b, c.pullwise.d)
			n := float64(b.N)
			b.ReportMetric(med["stock"].Seconds()/n, "stock-median-s")
			b.ReportMetric(med["pullwise"].Seconds()/n, "pullwise-median-s")
			b.ReportMetric(float64(med["pullwise"])/float64(med["stock"]), "median-ratio")
			b.ReportMetric(span["stock"].Seconds()/n, "stock-makespan-s")
			b.ReportMetric(span["pullwise"].Seconds()/n, "pullwise-makespan-s")
			b.ReportMetric(float64(span["pullwise"])/float64(span["stock"]), "makespan-ratio")
			// CPU used during the burst by containerd and by this process
			// (the registry, the WAN profile, the CRI clients). The median
			// image cannot be in before the smallest half of the images'
			// share of that work (by their bytes) has run on all the CPUs:
			// the median-ratio no order of the work can beat here.
			b.ReportMetric(cpu["stock"].Seconds()/n, "stock-cpu-s")
			b.ReportMetric(cpu["pullwise"].Seconds()/n, "pullwise-cpu-s")
			// containerd's share alone: on a node the registry is elsewhere.
			b.ReportMetric(daemonCPU["stock"].Seconds()/n, "stock-daemon-cpu-s")
			b.ReportMetric(daemonCPU["pullwise"].Seconds()/n, "pullwise-daemon-cpu-s")
			share := smallestShare(pulls, pulls/2+1, image)
			b.ReportMetric(share*cpu["pullwise"].Seconds()/float64(runtime.NumCPU())/med["stock"].Seconds(), "cpu-bound-median-ratio")
		})
	}
}

// writeTimelines appends the timeline lines of d's log
// (daemon.TimelineLine) and its "pulled image for CRI" lines to the file
// PULLWISE_BENCH_TIMELINES names, under the benchmark's name; without it,
// nothing.
func writeTimelines(b *testing.B, d *daemon.Daemon) {
	path := daemon.Timelines()
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "# %s\n", b.Name())
	for _, line := range strings.Split(d.Log(), "\n") {
		// The timeline ends with the transfer; the CRI line's elapsed
		// adds the image records CRI needs after it.
		if daemon.TimelineLine(line) || strings.Contains(line, "pulled image for CRI") {
			fmt.Fprintln(f, line)
		}
	}
}

// smallestShare is the share of the n smallest of the first pulls images
// in all their layer bytes.
func smallestShare(pulls, n int, image func(j int) registry.Image) float64 {
	sizes := make([]int64, pulls)
	var all int64
	for j := range sizes {
		for _, l := range image(j).Layers {
			sizes[j] += l
		}
		all += sizes[j]
	}
	slices.Sort(sizes)
	var small int64
	for _, s := range sizes[:n] {
		small += s
	}
	return float64(small) / float64(all)
}

// BenchmarkIdenticalPulls: 20 concurrent pulls of one image of 4 layers.
func BenchmarkIdenticalPulls(b *testing.B) {
	c := newContenders(b, gateConfig(daemon.Limit(b), "0s"))
	wall, reqs := map[string]time.Duration{}, map[string]int{}
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		repo := fmt.Sprintf("bench/same%d", i)
		img := c.pullwise.upstream.Push(b, repo, "v1", registry.Image{
			Layers: []int64{1 << 20, 1 << 20, 1 << 20, 1 << 20}, Seed: int64(20000 + i)})
		b.StartTimer()
		c.each(b, i, func(name string, e *env) {
			if err := e.upstream.WaitIdle(context.Background()); err != nil {
				b.Fatal(err)
			}
			e.upstream.Reset()
			refs := slices.Repeat([]string{img.Ref}, 20)
			d := pullAll(b, e, refs)
			wall[name] += d[len(d)-1]
			if err := e.upstream.WaitIdle(context.Background()); err != nil {
				b.Fatal(err)
			}
			reqs[name] += e.upstream.Count(func(r registry.Request) bool { return r.Repo == repo })
		})
	}
	n := float64(b.N)
	b.ReportMetric(float64(reqs["stock"])/n, "stock-requests")
	b.ReportMetric(float64(reqs["pullwise"])/n, "pullwise-requests")
	b.ReportMetric(wall["stock"].Seconds()/n, "stock-wall-s")
	b.ReportMetric(wall["pullwise"].Seconds()/n, "pullwise-wall-s")
	b.ReportMetric(float64(wall["pullwise"])/float64(wall["stock"]), "wall-ratio")
}

// BenchmarkRepull: a pull of an image already present and unchanged, by
// kubelet's Always (CRI PullImage), on stock containerd and on Pullwise, and
// on Pullwise with IfNewerNotPresent (the pod annotation).
func BenchmarkRepull(b *testing.B) {
	c := newContenders(b, gateConfig(daemon.Limit(b), "0s"))
	img := c.pullwise.upstream.Push(b, "bench/repull", "v1", registry.Image{Layers: []int64{1 << 20, 1 << 20}, Seed: 30000})
	ctx := context.Background()
	plain := criImage(img.Ref)
	ifNewer := &criapi.ImageSpec{Image: img.Ref, Annotations: map[string]string{"pullwise.io/image-pull-policy": "IfNewerNotPresent"}}
	c.each(b, 0, func(_ string, e *env) {
		if _, err := e.images.PullImage(ctx, plain, nil, nil); err != nil {
			b.Fatal(err)
		}
	})
	lat, reqs := map[string]time.Duration{}, map[string]int{}
	measure := func(name string, e *env, spec *criapi.ImageSpec) {
		b.StopTimer()
		if err := e.upstream.WaitIdle(ctx); err != nil {
			b.Fatal(err)
		}
		e.upstream.Reset()
		b.StartTimer()
		start := time.Now()
		if _, err := e.images.PullImage(ctx, spec, nil, nil); err != nil {
			b.Fatal(err)
		}
		lat[name] += time.Since(start)
		b.StopTimer()
		if err := e.upstream.WaitIdle(ctx); err != nil {
			b.Fatal(err)
		}
		reqs[name] += len(e.upstream.Requests())
		b.StartTimer()
	}
	for i := 0; b.Loop(); i++ {
		c.each(b, i, func(name string, e *env) {
			measure(name, e, plain)
			if name == "pullwise" {
				measure("ifnewer", e, ifNewer)
			}
		})
	}
	n := float64(b.N)
	for _, name := range []string{"stock", "pullwise", "ifnewer"} {
		b.ReportMetric(float64(lat[name].Microseconds())/n/1000, name+"-ms")
		b.ReportMetric(float64(reqs[name])/n, name+"-requests")
	}
	b.ReportMetric(float64(lat["pullwise"])/float64(lat["stock"]), "latency-ratio")
	b.ReportMetric(float64(lat["ifnewer"])/float64(lat["stock"]), "ifnewer-latency-ratio")
}
