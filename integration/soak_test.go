package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

// soakSize is the soak's least pulls per round and its rounds: modest in
// `make test`, larger under `make soak` (SOAK_PULLS, SOAK_ROUNDS). A round
// also lasts until every fault has had its phase.
func soakSize(t *testing.T) (pulls, rounds int) {
	pulls, rounds = 60, 3
	for name, v := range map[string]*int{"SOAK_PULLS": &pulls, "SOAK_ROUNDS": &rounds} {
		if s := os.Getenv(name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				t.Fatalf("%s=%q: want a positive number", name, s)
			}
			*v = n
		}
	}
	return pulls, rounds
}

const (
	soakCallers  = 6
	soakImages   = 12
	soakPhase    = 1500 * time.Millisecond // how long each fault lasts
	soakHeapSlop = 4 << 20                 // GC noise and caches that settle
)

// soakConfig: the gate of the issue, and registry timeouts short enough
// that stalls end soon, yet above what a loaded machine's registry needs
// (at 1s the clean pulls at the end timed out on a busy machine).
const soakConfig = `[plugins."io.containerd.grpc.v1.pullwise"]
  max_parallel_image_pulls = 4
  registry_response_timeout = "3s"
  registry_read_timeout = "3s"
  registry_cooldown = "1s"
  registry_max_cooldown = "2s"
`

// soakFault is one phase of the soak: a fault hitting about half the
// requests, or (refused) the registry's address pointing nowhere.
type soakFault struct {
	name  string
	fault *registry.Fault
}

var soakFaults = []soakFault{
	{"healthy", nil},
	{"503", &registry.Fault{Status: 503}},
	{"500", &registry.Fault{Status: 500}},
	{"429", &registry.Fault{Status: 429, RetryAfter: time.Second}},
	{"stall", &registry.Fault{Delay: 6 * time.Second}},
	{"cut", &registry.Fault{TruncateAfter: 1000}},
	{"refused", nil},
}

// Codes a failed pull may end with under the soak: the caller gave up,
// or the registry failed or throttled. Internal or Unknown would be a bug.
var soakCodes = []codes.Code{codes.Canceled, codes.DeadlineExceeded, codes.Unavailable, codes.ResourceExhausted}

// soakResults counts outcomes by gRPC code and keeps an example of each
// error whose code is not among soakCodes.
type soakResults struct {
	mu    sync.Mutex
	codes map[codes.Code]int
	bad   map[codes.Code]string
	// badRefs are the images of the examples in bad, whose lines of the
	// daemon's log the test prints: the log's tail rarely holds them.
	badRefs map[codes.Code]string
	// RemoveImage calls by ref, started and ended.
	removing, removed map[string]int
	// flying are the pulls of each ref under way. A pull that begins
	// while others of its ref run may share their transfer (dedupe), so
	// a removal that overlapped theirs overlapped its own too.
	flying map[string]map[*flight]struct{}
}

// flight is a pull under way: where the removals of its ref stood when
// it, or the earliest pull of the ref under way then, began.
type flight struct{ at removals }

func (r *soakResults) begin(ref string) *flight {
	r.mu.Lock()
	defer r.mu.Unlock()
	f := &flight{at: removals{r.removing[ref], r.removed[ref]}}
	for o := range r.flying[ref] {
		if o.at.started < f.at.started {
			f.at = o.at
		}
	}
	if r.flying[ref] == nil {
		r.flying[ref] = map[*flight]struct{}{}
	}
	r.flying[ref][f] = struct{}{}
	return f
}

func (r *soakResults) end(ref string, f *flight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.flying[ref], f)
}

func (r *soakResults) add(what, ref string, err error) {
	c := status.Code(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.codes[c]++
	if err != nil && !slices.Contains(soakCodes, c) && r.bad[c] == "" {
		r.bad[c] = what + " " + ref + ": " + err.Error()
		r.badRefs[c] = ref
	}
}

func (r *soakResults) remove(e *env, ctx context.Context, ref string) {
	r.mu.Lock()
	r.removing[ref]++
	r.mu.Unlock()
	err := e.images.RemoveImage(ctx, criImage(ref))
	r.mu.Lock()
	r.removed[ref]++
	r.mu.Unlock()
	r.add("RemoveImage", ref, err)
}

// removals marks where the removals of ref stand, for overlaps.
type removals struct{ started, ended int }

func (r *soakResults) removals(ref string) removals {
	r.mu.Lock()
	defer r.mu.Unlock()
	return removals{r.removing[ref], r.removed[ref]}
}

// addPull records a pull's outcome. A pull that a RemoveImage of the same
// image overlapped (one was under way when it, or a pull of the same
// image it may share, began, or one began before it ended) may end
// NotFound: the pull reads the image back after the
// transfer and finds it, or its config, gone, as upstream CRI does. That
// is the caller's doing and says so; any other NotFound is not.
func (r *soakResults) addPull(ref string, atStart removals, err error) {
	overlapped := atStart.started != atStart.ended || r.removals(ref).started != atStart.started
	if status.Code(err) == codes.NotFound && overlapped {
		r.mu.Lock()
		r.codes[codes.NotFound]++
		r.mu.Unlock()
		return
	}
	r.add("pull", ref, err)
}

// TestSoak runs rounds of pulls by several callers through the gate while
// the registry's faults change every few seconds, callers give up at
// random and images are removed at random. After each round nothing is
// left queued or in flight, containerd's goroutines are back to their
// baseline and its live heap has not grown; at the end every image pulls
// cleanly.
func TestSoak(t *testing.T) {
	pulls, rounds := soakSize(t)
	e := newEnv(t, envOptions{extraConfig: soakConfig, noKeepAlive: true, logLevel: "info"})
	var refs []string
	for i := range soakImages {
		refs = append(refs, e.push(fmt.Sprintf("soak/img%02d", i), "v1",
			registry.Image{Layers: []int64{48 << 10, 64 << 10, 96 << 10}, Seed: int64(5000 + i)}).Ref)
	}
	deadAddr := "http://" + freeLoopback(t)
	ctx := context.Background()

	// Warm up what lives as long as the daemon (connections, the health
	// table, CRI's caches), then take the baselines.
	for _, ref := range refs {
		e.criPull(ref)
	}
	e.listPulls()
	e.metric("pullwise_pulls_in_flight")
	baseline := e.d.Goroutines(t)
	var heaps []int64

	res := &soakResults{codes: map[codes.Code]int{}, bad: map[codes.Code]string{}, badRefs: map[codes.Code]string{}, removing: map[string]int{}, removed: map[string]int{}, flying: map[string]map[*flight]struct{}{}}
	for round := 1; round <= rounds; round++ {
		start := time.Now()
		stop := make(chan struct{})
		var bg sync.WaitGroup
		// Faults: a new phase every soakPhase, each hitting about half the
		// requests, so some pulls get through every phase.
		var phase atomic.Pointer[soakFault]
		phase.Store(&soakFaults[0])
		cycled := make(chan struct{}) // every fault has had its phase
		e.upstream.SetFault(func(registry.Request) *registry.Fault {
			if f := phase.Load().fault; f != nil && rand.IntN(2) == 0 {
				return f
			}
			return nil
		})
		bg.Add(1)
		go func() {
			defer bg.Done()
			tick := time.NewTicker(soakPhase)
			defer tick.Stop()
			for i := 1; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if i == len(soakFaults) {
					close(cycled)
				}
				f := &soakFaults[i%len(soakFaults)]
				if f.name == "refused" {
					e.writeHostsFor(e.upstream.Host(), deadAddr, "")
				} else if phase.Load().name == "refused" {
					e.writeHosts()
				}
				phase.Store(f)
			}
		}()
		// Images go away at random, so pulls keep reaching the registry.
		bg.Add(1)
		go func() {
			defer bg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				res.remove(e, ctx, refs[rand.IntN(len(refs))])
			}
		}()

		var done atomic.Int64
		var callers sync.WaitGroup
		for c := range soakCallers {
			callers.Add(1)
			go func() {
				defer callers.Done()
				for {
					select {
					case <-cycled:
						if done.Load() >= int64(pulls) {
							return
						}
					default:
					}
					soakPull(e, ctx, res, refs[rand.IntN(len(refs))], fmt.Sprintf("pod%d", c))
					done.Add(1)
				}
			}()
		}
		callers.Wait()
		pulled := time.Since(start)
		close(stop)
		bg.Wait()
		e.upstream.SetFault(nil)
		e.writeHosts()

		if !e.d.Running() {
			t.Fatalf("round %d: containerd died", round)
		}
		eventually(t, 30*time.Second, "no pull listed", func() bool { return len(e.listPulls()) == 0 })
		for _, g := range []string{`pullwise_pulls_in_flight`, `pullwise_pulls_waiting`} {
			if v := e.metric(g); v != 0 {
				t.Fatalf("round %d: %s = %v with no pull left", round, g, v)
			}
		}
		e.awaitGoroutines(baseline, 60*time.Second)
		heaps = append(heaps, settledHeap(t, e))
		t.Logf("round %d: %d pulls in %s, settled after %s, live heap %.1f MiB, goroutines %d (baseline %d)",
			round, done.Load(), pulled.Round(100*time.Millisecond), time.Since(start).Round(100*time.Millisecond), float64(heaps[len(heaps)-1])/(1<<20), e.d.Goroutines(t), baseline)
	}
	t.Logf("outcomes by code: %v", res.codes)
	for c, example := range res.bad {
		t.Errorf("%d outcomes with code %s, e.g. %s", res.codes[c], c, example)
		t.Logf("containerd's log lines of %s:\n%s", res.badRefs[c], linesOf(e.d.Log(), imageName(res.badRefs[c]), 300))
	}
	if res.codes[codes.OK] == 0 || len(res.codes) < 3 {
		t.Errorf("outcomes %v: want successes and failures of several kinds, or the soak tested nothing", res.codes)
	}
	// The first round grows what lasts (caches, pools); from then on a
	// round must leave no more behind than the one before it did.
	for i := 1; i < len(heaps); i++ {
		if heaps[i] > heaps[0]+soakHeapSlop {
			t.Errorf("live heap after round %d: %.1f MiB, after round 1: %.1f MiB (all: %v)", i+1, float64(heaps[i])/(1<<20), float64(heaps[0])/(1<<20), heaps)
		}
	}

	// With the faults gone every image pulls cleanly.
	for _, ref := range refs {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := e.images.PullImage(cctx, criImage(ref), nil, nil)
		cancel()
		if err != nil {
			t.Errorf("pull of %s after the faults stopped: %v", ref, err)
		}
	}
	if p := e.listPulls(); len(p) != 0 {
		t.Errorf("ListPulls after the clean pulls: %v", p)
	}
}

// soakPull is one pull by a caller that may give up, through CRI or the
// Pullwise API; a third of the time the image is removed first, so that
// the pull reaches the registry.
func soakPull(e *env, ctx context.Context, res *soakResults, ref, pod string) {
	if rand.IntN(3) == 0 {
		res.remove(e, ctx, ref)
	}
	f := res.begin(ref)
	defer res.end(ref, f)
	// Callers that never give up still have a deadline, as kubelet does;
	// it is far above what any fault costs.
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	switch rand.IntN(4) {
	case 0:
		pctx, cancel = context.WithTimeout(pctx, time.Duration(rand.IntN(1500))*time.Millisecond)
		defer cancel()
	case 1:
		var cancelNow context.CancelFunc
		pctx, cancelNow = context.WithCancel(pctx)
		t := time.AfterFunc(time.Duration(rand.IntN(1500))*time.Millisecond, cancelNow)
		defer t.Stop()
		defer cancelNow()
	}
	var err error
	if rand.IntN(4) == 0 {
		_, err = e.pullwise.PullImage(pctx, &api.PullImageRequest{Image: criImage(ref), SandboxConfig: sandbox(pod)})
	} else {
		_, err = e.images.PullImage(pctx, criImage(ref), nil, sandbox(pod))
	}
	res.addPull(ref, f.at, err)
}

// settledHeap is containerd's live heap after a forced GC, the least of a
// few samples: what a sample catches in flight (containerd's own garbage
// collection of removed images, a scrape) is not what the round left.
func settledHeap(t *testing.T, e *env) int64 {
	least := e.d.LiveHeap(t)
	for range 4 {
		time.Sleep(500 * time.Millisecond)
		least = min(least, e.d.LiveHeap(t))
	}
	return least
}

// linesOf returns the last n lines of log that contain s.
func linesOf(log, s string, n int) string {
	var out []string
	for line := range strings.Lines(log) {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return strings.Join(out[max(0, len(out)-n):], "")
}

// imageName is ref without its registry host, as containerd's log lines
// may name it either way.
func imageName(ref string) string {
	if _, path, ok := strings.Cut(ref, "/"); ok {
		return path
	}
	return ref
}
