package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

func gateConfig(limit int, timeout string) string {
	return fmt.Sprintf("[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  max_parallel_image_pulls = %d\n  pull_queue_timeout = %q\n", limit, timeout)
}

func (e *env) listPulls() []*api.Pull {
	e.t.Helper()
	resp, err := e.pullwise.ListPulls(context.Background(), &api.ListPullsRequest{})
	if err != nil {
		e.t.Fatalf("ListPulls: %v", err)
	}
	return resp.GetPulls()
}

func (e *env) pullsIn(state string) int {
	n := 0
	for _, p := range e.listPulls() {
		if p.GetState() == state {
			n++
		}
	}
	return n
}

func sandbox(name string) *criapi.PodSandboxConfig {
	return &criapi.PodSandboxConfig{Metadata: &criapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name}}
}

// firstBlob returns the repositories in the order the registry first saw
// a blob request for each: the order pulls had their slots, since a pull
// waiting for one asks only for its manifests.
func firstBlob(r *registry.Registry) []string {
	var order []string
	seen := map[string]bool{}
	for _, req := range r.Requests() {
		if req.Kind == registry.KindBlob && !seen[req.Repo] {
			seen[req.Repo] = true
			order = append(order, req.Repo)
		}
	}
	return order
}

func TestGateHoldsLimitNodeWide(t *testing.T) { forEachCRIPullConfig(t, testGateHoldsLimitNodeWide) }

func testGateHoldsLimitNodeWide(t *testing.T, criImages string) {
	e := newEnv(t, envOptions{criImages: criImages, extraConfig: gateConfig(3, "0s")})
	const n = 30
	var refs []string
	for i := range n {
		refs = append(refs, e.push(fmt.Sprintf("limit/img%02d", i), "v1", registry.Image{Layers: []int64{32 << 10, 32 << 10}, Seed: int64(100 + i)}).Ref)
	}
	// Blobs take a while, so pulls holding slots overlap and the peak
	// shows the limit rather than how fast loopback is.
	e.upstream.SetFault(func(r registry.Request) *registry.Fault {
		if r.Kind == registry.KindBlob {
			return &registry.Fault{Delay: 100 * time.Millisecond}
		}
		return nil
	})
	ctx := context.Background()
	errs := make(chan error, n)
	for i, ref := range refs {
		go func() {
			_, err := e.images.PullImage(ctx, criImage(ref), nil, sandbox(fmt.Sprintf("pod%02d", i)))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := e.upstream.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	// Pulls waiting for a slot ask for their manifests; only a pull
	// with a slot fetches blobs.
	blobs := slices.DeleteFunc(e.upstream.Requests(), func(r registry.Request) bool { return r.Kind != registry.KindBlob })
	if peak := peakBy(blobs, func(_ int, r registry.Request) string { return r.Repo }); peak != 3 {
		t.Fatalf("%d images had blob requests in flight at once, want exactly the limit 3", peak)
	}
	if got := e.metric(pulledSample); got != n {
		t.Fatalf("%s = %v, want %d", pulledSample, got, n)
	}
}

func TestGateQueueIsFIFO(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	const n = 8
	var refs []string
	for i := range n {
		refs = append(refs, e.push(fmt.Sprintf("fifo/img%d", i), "v1", registry.Image{Layers: []int64{16 << 10}, Seed: int64(200 + i)}).Ref)
	}
	release := e.upstream.HoldBlobs(t, func(string) bool { return true })
	ctx := context.Background()
	errs := make(chan error, n)
	for i, ref := range refs {
		go func() {
			_, err := e.images.PullImage(ctx, criImage(ref), nil, sandbox(fmt.Sprintf("pod%d", i)))
			errs <- err
		}()
		// Queue them one after another so the expected order is known.
		eventually(t, 10*time.Second, fmt.Sprintf("pull %d queued", i), func() bool { return len(e.listPulls()) == i+1 })
	}
	pulls := e.listPulls()
	if pulls[0].GetState() != "pulling" || e.pullsIn("waiting") != n-1 {
		t.Fatalf("want 1 pulling and %d waiting, got %v", n-1, pulls)
	}
	if pulls[1].GetPod().GetName() != "pod1" {
		t.Fatalf("ListPulls does not name the pod: %v", pulls[1])
	}
	out, err := e.pullctl("pulls")
	if err != nil || !strings.Contains(out, "default/pod3") || !strings.Contains(out, "waiting") {
		t.Fatalf("pullctl pulls (err %v):\n%s", err, out)
	}
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var want []string
	for i := range n {
		want = append(want, fmt.Sprintf("fifo/img%d", i))
	}
	if got := firstBlob(e.upstream); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("registry saw images in order %v, want FIFO %v", got, want)
	}
}

func TestGateQueueTimeout(t *testing.T) { forEachCRIPullConfig(t, testGateQueueTimeout) }

func testGateQueueTimeout(t *testing.T, criImages string) {
	e := newEnv(t, envOptions{criImages: criImages, extraConfig: gateConfig(1, "300ms")})
	held := e.push("timeout/held", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 300})
	queued := e.push("timeout/queued", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 301})
	release := e.upstream.HoldBlobs(t, func(repo string) bool { return repo == "timeout/held" })
	ctx := context.Background()
	heldErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(held.Ref), nil, nil); heldErr <- err }()
	eventually(t, 10*time.Second, "held pull running", func() bool { return e.pullsIn("pulling") == 1 })

	_, err := e.images.PullImage(ctx, criImage(queued.Ref), nil, nil)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("queued pull got %v, want ResourceExhausted", err)
	}
	for _, want := range []string{"max_parallel_image_pulls", "1 slots", "300ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if e.upstream.Count(blobsOf("timeout/queued")) != 0 {
		t.Fatal("timed-out pull fetched blobs")
	}
	if got := e.metric(`pullwise_pulls_total{outcome="timed_out"}`); got != 1 {
		t.Fatalf("timed_out = %v", got)
	}
	release()
	if err := <-heldErr; err != nil {
		t.Fatal(err)
	}
}

func TestGateCancelledPullsLeakNothing(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(2, "0s"), noKeepAlive: true})
	var refs []string
	for i := range 52 {
		refs = append(refs, e.push(fmt.Sprintf("cancel/img%02d", i), "v1", registry.Image{Layers: []int64{8 << 10}, Seed: int64(400 + i)}).Ref)
	}
	next := e.push("cancel/next", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 499})
	e.listPulls() // the test's own connections count in the baseline
	baseline := e.d.Goroutines(t)

	release := e.upstream.HoldBlobs(t, func(repo string) bool { return repo != "cancel/next" })
	ctx := context.Background()
	heldErrs := make(chan error, 2)
	for _, ref := range refs[:2] {
		go func() { _, err := e.images.PullImage(ctx, criImage(ref), nil, nil); heldErrs <- err }()
	}
	eventually(t, 10*time.Second, "two pulls holding the slots", func() bool { return e.pullsIn("pulling") == 2 })

	cancels := make([]context.CancelFunc, 0, 50)
	errs := make(chan error, 50)
	for _, ref := range refs[2:] {
		cctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		go func() { _, err := e.images.PullImage(cctx, criImage(ref), nil, nil); errs <- err }()
	}
	eventually(t, 10*time.Second, "50 pulls queued", func() bool { return e.pullsIn("waiting") == 50 })
	rand.Shuffle(len(cancels), func(i, j int) { cancels[i], cancels[j] = cancels[j], cancels[i] })
	for _, c := range cancels {
		c()
	}
	for range 50 {
		if err := <-errs; status.Code(err) != codes.Canceled {
			t.Fatalf("cancelled pull got %v", err)
		}
	}
	eventually(t, 10*time.Second, "queue empty", func() bool { return e.pullsIn("waiting") == 0 })
	release()
	for range 2 {
		if err := <-heldErrs; err != nil {
			t.Fatal(err)
		}
	}
	// No slot leaked: with both slots free again a new pull gets one at
	// once; a leaked slot would leave it queued until the deadline.
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := e.images.PullImage(nctx, criImage(next.Ref), nil, nil); err != nil {
		t.Fatalf("pull after the cancellations: %v", err)
	}
	for _, c := range []string{`pullwise_pulls_in_flight`, `pullwise_pulls_waiting`} {
		if got := e.metric(c); got != 0 {
			t.Fatalf("%s = %v after all pulls ended", c, got)
		}
	}
	eventually(t, 10*time.Second, fmt.Sprintf("goroutines back to baseline %d", baseline), func() bool {
		return e.d.Goroutines(t) <= baseline
	})
}

func TestGateDedupesIdenticalPulls(t *testing.T) {
	forEachCRIPullConfig(t, testGateDedupesIdenticalPulls)
}

func testGateDedupesIdenticalPulls(t *testing.T, criImages string) {
	e := newEnv(t, envOptions{criImages: criImages, extraConfig: gateConfig(3, "0s")})
	img := e.push("dedupe/app", "v1", registry.Image{Layers: []int64{64 << 10, 64 << 10, 64 << 10, 64 << 10}, Seed: 500})
	release := e.upstream.HoldBlobs(t, func(string) bool { return true })
	ctx := context.Background()
	const n = 20
	errs := make(chan error, n)
	ids := make(chan string, n)
	for i := range n {
		go func() {
			id, err := e.images.PullImage(ctx, criImage(img.Ref), nil, sandbox(fmt.Sprintf("pod%d", i)))
			ids <- id
			errs <- err
		}()
	}
	eventually(t, 10*time.Second, "20 callers sharing one pull", func() bool {
		p := e.listPulls()
		return len(p) == 1 && p[0].GetCallers() == n
	})
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		if id := <-ids; id != img.Config.String() {
			t.Fatalf("a caller got image %q, want %s", id, img.Config)
		}
	}
	if err := e.upstream.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	heads := e.upstream.Count(func(r registry.Request) bool { return r.Method == "HEAD" && r.Kind == registry.KindManifest })
	gets := e.upstream.Count(func(r registry.Request) bool { return r.Method == "GET" && r.Kind == registry.KindManifest })
	if heads != 1 || gets != 1 {
		t.Fatalf("%d manifest HEADs and %d GETs for 20 identical pulls, want 1 and 1", heads, gets)
	}
	for _, d := range append(img.Layers, img.Config) {
		if c := e.upstream.Count(func(r registry.Request) bool { return r.Reference == d.String() && r.Method == "GET" }); c != 1 {
			t.Fatalf("blob %s fetched %d times", d, c)
		}
	}
	if got := e.metric(`pullwise_pulls_total{outcome="deduped"}`); got != n-1 {
		t.Fatalf("deduped = %v, want %d", got, n-1)
	}
}

func TestGateFastPath(t *testing.T) { forEachCRIPullConfig(t, testGateFastPath) }

func testGateFastPath(t *testing.T, criImages string) {
	e := newEnv(t, envOptions{criImages: criImages})
	img := e.push("fast/app", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 600})
	ctx := context.Background()
	if _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); err != nil {
		t.Fatal(err)
	}
	digestRef := fmt.Sprintf("%s/fast/app@%s", e.upstream.Host(), img.Digest)
	for _, tc := range []struct {
		ref      string
		requests int
	}{
		{digestRef, 0},
		{img.Ref, 1},
	} {
		if err := e.upstream.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
		e.upstream.Reset()
		before := e.metric(`pullwise_pulls_total{outcome="fast_path"}`)
		id, err := e.images.PullImage(ctx, criImage(tc.ref), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if id != img.Config.String() {
			t.Fatalf("%s: image %q", tc.ref, id)
		}
		if err := e.upstream.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
		reqs := e.upstream.Requests()
		if len(reqs) != tc.requests || (tc.requests == 1 && reqs[0].Method != "HEAD") {
			t.Fatalf("re-pull of present %s sent %v, want %d HEAD", tc.ref, reqs, tc.requests)
		}
		if got := e.metric(`pullwise_pulls_total{outcome="fast_path"}`); got != before+1 {
			t.Fatalf("fast_path %v -> %v", before, got)
		}
	}
}

func TestGateSharedWithCtrAndSandboxBypass(t *testing.T) {
	pause := "sandbox/pause"
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	// The sandbox image's name depends on the registry's port, so the
	// daemon is configured after the registry exists: restart with it.
	pauseImg := e.push(pause, "3.10", registry.Image{Layers: []int64{8 << 10}, Seed: 700})
	held := e.push("shared/held", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 701})
	viaCtr := e.push("shared/ctr", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 702})
	e.restartWith(t, envOptions{extraConfig: gateConfig(1, "0s"),
		criImages: fmt.Sprintf("  [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n    sandbox = %q\n", pauseImg.Ref)})

	release := e.upstream.HoldBlobs(t, func(repo string) bool { return repo == "shared/held" })
	ctx := context.Background()
	heldErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(held.Ref), nil, nil); heldErr <- err }()
	eventually(t, 10*time.Second, "held pull running", func() bool { return e.pullsIn("pulling") == 1 })

	// ctr's pull waits for the same slot.
	ctrErr := make(chan error, 1)
	go func() {
		out, err := e.ctr("default", "image", "pull", "--plain-http", viaCtr.Ref)
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		ctrErr <- err
	}()
	eventually(t, 10*time.Second, "ctr pull queued", func() bool { return e.pullsIn("waiting") == 1 })

	// The sandbox image does not wait behind them.
	if _, err := e.images.PullImage(ctx, criImage(pauseImg.Ref), nil, nil); err != nil {
		t.Fatalf("sandbox image pull: %v", err)
	}
	if e.pullsIn("waiting") != 1 {
		t.Fatal("ctr pull ran while the slot was held")
	}
	release()
	if err := <-heldErr; err != nil {
		t.Fatal(err)
	}
	if err := <-ctrErr; err != nil {
		t.Fatal(err)
	}
}

// TestGateSlotFreedOnceBlobsAreIn: a pull gives its slot back when every
// blob is in, so with a limit of 1 the next pull downloads while the first
// one still unpacks. ListPulls shows both at once: one unpacking, one
// pulling.
func TestGateSlotFreedOnceBlobsAreIn(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	// Large, compressible layers: unpacking them takes long enough to see.
	first := e.push("release/first", "v1", registry.Image{Layers: []int64{32 << 20, 32 << 20, 32 << 20}, Seed: 610, Compressible: true})
	next := e.push("release/next", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 611})
	release := e.upstream.HoldBlobs(t, func(repo string) bool { return repo == "release/next" })

	ctx := context.Background()
	errs := make(chan error, 2)
	go func() { _, err := e.images.PullImage(ctx, criImage(first.Ref), nil, nil); errs <- err }()
	eventually(t, 10*time.Second, "the first pull holding the slot", func() bool { return e.pullsIn("pulling") == 1 })
	go func() { _, err := e.images.PullImage(ctx, criImage(next.Ref), nil, nil); errs <- err }()

	eventually(t, 30*time.Second, "one pull unpacking while the next one pulls", func() bool {
		return e.pullsIn("unpacking") == 1 && e.pullsIn("pulling") == 1
	})
	if got := e.metric("pullwise_pulls_in_flight"); got != 1 {
		t.Fatalf("pullwise_pulls_in_flight = %v with one pull fetching and one unpacking, want 1", got)
	}
	release()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if pulls := e.listPulls(); len(pulls) != 0 {
		t.Fatalf("pulls left: %v", pulls)
	}
}

// TestGateRedirectedBlobs: a registry that sends its blob GETs to a CDN, as
// Docker Hub does. The download lane bounds the CDN's downloads as it does
// a registry's, the pull source labels count the CDN's bytes for the
// registry, and each pull learns when its blobs are all in (its timeline
// says so), which is when it gives its slot back.
func TestGateRedirectedBlobs(t *testing.T) {
	e := newEnv(t, envOptions{redirectBlobs: true, extraConfig: gateConfig(2, "0s"), transfer: "max_concurrent_downloads = 1\n"})
	var imgs []registry.Pushed
	layers := map[string]bool{}
	for i := range 4 {
		img := e.push(fmt.Sprintf("cdn/app%d", i), "v1", registry.Image{Layers: []int64{1 << 20, 1 << 20, 1 << 20}, Seed: int64(620 + i)})
		imgs = append(imgs, img)
		for _, l := range img.Layers {
			layers[l.Encoded()] = true
		}
	}
	cdn := e.upstream.CDN()
	// 1/8 s per layer: long enough for downloads to overlap if nothing
	// holds them back.
	cdn.SetRate(8 << 20)

	ctx := context.Background()
	errs := make(chan error, len(imgs))
	for _, img := range imgs {
		go func() { _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); errs <- err }()
	}
	for range imgs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := cdn.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}

	// The CDN serves a blob at .../sha256/<2 hex>/<hex>/data.
	var spans []registry.Request
	for _, r := range cdn.Requests() {
		if layers[path.Base(path.Dir(r.Path))] {
			spans = append(spans, r)
		}
	}
	if len(spans) != len(layers) {
		t.Fatalf("the CDN served %d layer downloads, want %d", len(spans), len(layers))
	}
	// One place; a second request may go out in the last round trip of
	// the body before it (docs/pull-gate.md).
	if peak := peakBy(spans, func(i int, _ registry.Request) string { return strconv.Itoa(i) }); peak > 2 {
		t.Errorf("%d layer downloads at the CDN at once with max_concurrent_downloads = 1, want at most 2", peak)
	}

	log := e.d.Log()
	waited := 0
	for _, img := range imgs {
		if timelineHas(log, img.Ref, "waited_download=") {
			waited++
		}
		blobs := blobHosts(t, e.imageLabels("k8s.io", img.Ref)[blobSourceLabel])
		want := img.LayerBytes() + img.ConfigSize
		if got := blobs[e.upstream.Host()]; len(blobs) != 1 || got.Blobs != len(img.Layers)+1 || got.Bytes != want {
			t.Errorf("%s: blob sources %v, want %d blobs of %d bytes in all from %s", img.Ref, blobs, len(img.Layers)+1, want, e.upstream.Host())
		}
		if !timelineHas(log, img.Ref, "fetched=") {
			t.Errorf("%s: no fetched= in its pull timeline: the pull never learned its blobs were in", img.Ref)
		}
		if !timelineHas(log, img.Ref, "cost=") {
			t.Errorf("%s: no cost= in its pull timeline: the pull was never priced", img.Ref)
		}
	}
	// Two pulls at once with one download place: one waits for it.
	if waited == 0 {
		t.Error("no pull timeline has waited_download=, though two pulls at a time shared one download place")
	}
}

// peakBy is the largest number of distinct keys that had a request in
// flight at one instant, key(i, r) being the key of the i-th request.
func peakBy(reqs []registry.Request, key func(int, registry.Request) string) int {
	type edge struct {
		at    time.Time
		key   string
		delta int
	}
	var edges []edge
	for i, r := range reqs {
		k := key(i, r)
		edges = append(edges, edge{r.Start, k, 1}, edge{r.End, k, -1})
	}
	// At the same instant an end comes before a start.
	slices.SortFunc(edges, func(a, b edge) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.delta - b.delta
	})
	inFlight, peak := map[string]int{}, 0
	for _, e := range edges {
		if inFlight[e.key] += e.delta; inFlight[e.key] == 0 {
			delete(inFlight, e.key)
		}
		peak = max(peak, len(inFlight))
	}
	return peak
}

// blobsOf matches the blob requests of repo. A pull waiting for a slot
// asks for its manifests, to learn its size while it waits; it asks for no
// blob before it has a slot.
func blobsOf(repo string) func(registry.Request) bool {
	return func(r registry.Request) bool { return r.Repo == repo && r.Kind == registry.KindBlob }
}

// timelineHas reports whether the "image pull timeline" line of ref has s.
func timelineHas(log, ref, s string) bool {
	line := logLine(log, "image pull timeline", `image="`+ref+`"`)
	return line != "" && strings.Contains(line, s)
}

// TestSmallPullOvertakesLarge: with one download place, a small image
// asked for just after a large one gets the next place, before the large
// one's other layers, as it would be done long before it (lane.Ticket).
// With the CPUs busy the large pull's bodies give way to the small pull
// as soon as it is in flight, before it asks for any layer, and the place
// they give back must not go to the large pull's next layer, only to be
// held by a request that pauses at once (lane.Link.Unasked). A paused
// body holds no place (docs/pull-gate.md): which of the large pull's
// layers goes on first after is not asked.
func TestSmallPullOvertakesLarge(t *testing.T) {
	for _, tc := range []struct {
		name string
		busy bool
	}{
		{name: "idle CPUs"},
		{name: "busy CPUs", busy: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{extraConfig: gateConfig(2, "0s"), transfer: "max_concurrent_downloads = 1\n"})
			large := e.push("order/large", "v1", registry.Image{Layers: []int64{16 << 20, 16 << 20, 16 << 20}, Seed: 630})
			small := e.push("order/small", "v1", registry.Image{Layers: []int64{256 << 10}, Seed: 631})
			// A second per large layer: the small pull is asked for while
			// the first one is on the wire, and has most of it to ask for its
			// own layer, even on a loaded machine (at half a second, CI's
			// parallel tests once left the small pull's layer behind the
			// large one's second). Each of the small pull's manifest
			// requests takes a tenth of a second, so that it is in flight a
			// while before it asks for its layer, as a pull from a registry
			// further away would be.
			e.upstream.SetFault(func(r registry.Request) *registry.Fault {
				switch {
				case r.Kind == registry.KindBlob:
					return &registry.Fault{BytesPerSecond: 16 << 20}
				case r.Kind == registry.KindManifest && r.Repo == "order/small":
					return &registry.Fault{Delay: 100 * time.Millisecond}
				}
				return nil
			})
			if tc.busy {
				busyCPUs(t)
			}

			ctx := context.Background()
			errs := make(chan error, 2)
			go func() { _, err := e.images.PullImage(ctx, criImage(large.Ref), nil, nil); errs <- err }()
			eventually(t, 10*time.Second, "the large pull's first layer on the wire", func() bool {
				pulls := e.listPulls()
				return len(pulls) == 1 && pulls[0].GetBytesDone() > large.ConfigSize
			})
			go func() { _, err := e.images.PullImage(ctx, criImage(small.Ref), nil, nil); errs <- err }()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if err := e.upstream.WaitIdle(ctx); err != nil {
				t.Fatal(err)
			}

			var order []string
			var layers []registry.Request
			for _, r := range e.upstream.Requests() {
				if r.Kind != registry.KindBlob || r.Method != "GET" || r.Reference == large.Config.String() || r.Reference == small.Config.String() {
					continue
				}
				order = append(order, r.Repo)
				layers = append(layers, r)
			}
			want := []string{"order/large", "order/small", "order/large", "order/large"}
			if !slices.Equal(order, want) {
				t.Fatalf("layer downloads by repository %v, want %v: the small image's layer next after the one on the wire:%s", order, want, spansOf(layers))
			}
		})
	}
}

// spansOf says when each of reqs was served, from the first's start.
func spansOf(reqs []registry.Request) string {
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "\n\t%s %s: %d bytes, %v to %v", r.Repo, r.Reference, r.Bytes, r.Start.Sub(reqs[0].Start).Round(time.Millisecond), r.End.Sub(reqs[0].Start).Round(time.Millisecond))
	}
	return b.String()
}

// busyCPUs keeps every CPU of the machine busy twice over until the test
// ends, so that tasks wait for a CPU (/proc/pressure/cpu).
func busyCPUs(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var cmds []*exec.Cmd
	t.Cleanup(func() {
		cancel()
		for _, c := range cmds {
			_ = c.Wait()
		}
	})
	for range 2 * runtime.NumCPU() {
		c := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
}

// TestGateServesSmallPullFirst: pulls waiting for a slot learn their size
// while they wait, from their manifests (ListPulls shows it), and a small
// image asked for just after a large one gets the slot first, since it
// would be done long before (lane.Ticket). Once they run, neither asks the
// registry for its manifests again.
func TestGateServesSmallPullFirst(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	held := e.push("gatesize/held", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 640})
	// 48 MiB that do not compress: the small pull overtakes the large one
	// if it is asked for less than about 0.48 s after it.
	large := e.push("gatesize/large", "v1", registry.Image{Layers: []int64{16 << 20, 16 << 20, 16 << 20}, Seed: 641})
	small := e.push("gatesize/small", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 642})
	release := e.upstream.HoldBlobs(t, func(repo string) bool { return repo == "gatesize/held" })

	ctx := context.Background()
	errs := make(chan error, 3)
	pull := func(ref string) {
		go func() { _, err := e.images.PullImage(ctx, criImage(ref), nil, nil); errs <- err }()
	}
	pull(held.Ref)
	eventually(t, 10*time.Second, "the held pull holding the slot", func() bool { return e.pullsIn("pulling") == 1 })
	pull(large.Ref)
	eventually(t, 10*time.Second, "the large pull waiting", func() bool { return e.pullsIn("waiting") == 1 })
	pull(small.Ref)
	eventually(t, 10*time.Second, "the small pull waiting", func() bool { return e.pullsIn("waiting") == 2 })
	// ListPulls shows a waiting pull's size once it has its manifest.
	var waitedMs []int64 // oldest first
	eventually(t, 10*time.Second, "both waiting pulls sized", func() bool {
		waitedMs = nil
		var sizes []int64
		for _, p := range e.listPulls() {
			if p.GetState() == "waiting" {
				waitedMs = append(waitedMs, p.GetWaitedMs())
				sizes = append(sizes, p.GetBytesTotal())
			}
		}
		return slices.Equal(sizes, []int64{large.LayerBytes(), small.LayerBytes()})
	})
	release()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := e.upstream.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"gatesize/held", "gatesize/small", "gatesize/large"}
	if got := firstBlob(e.upstream); !slices.Equal(got, want) {
		t.Fatalf("slots went to %v, want %v (the waiting pulls were asked for %d ms apart)", got, want, waitedMs[0]-waitedMs[1])
	}
	manifests := func(repo, method string) int {
		return e.upstream.Count(func(r registry.Request) bool {
			return r.Repo == repo && r.Kind == registry.KindManifest && r.Method == method
		})
	}
	for _, repo := range want[1:] {
		if h, g := manifests(repo, "HEAD"), manifests(repo, "GET"); h != 1 || g != 1 {
			t.Errorf("%s: %d manifest HEADs and %d GETs, want 1 and 1", repo, h, g)
		}
	}
}
