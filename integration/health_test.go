package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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

// healthConfig sets the registry health keys; zero durations are left at
// their defaults.
func healthConfig(cooldown, maxCooldown, response, read time.Duration) string {
	s := "[plugins.\"io.containerd.grpc.v1.pullwise\"]\n"
	for k, v := range map[string]time.Duration{
		"registry_cooldown": cooldown, "registry_max_cooldown": maxCooldown,
		"registry_response_timeout": response, "registry_read_timeout": read,
	} {
		if v != 0 {
			s += fmt.Sprintf("  %s = %q\n", k, v)
		}
	}
	return s
}

// registries is `pullctl registries -o json`, by host.
func (e *env) registries() map[string]registryJSON {
	e.t.Helper()
	out, err := e.pullctl("registries", "-o", "json")
	if err != nil {
		e.t.Fatalf("pullctl registries: %v\n%s", err, out)
	}
	var list struct {
		Hosts []registryJSON `json:"hosts"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		e.t.Fatalf("pullctl registries output %q: %v", out, err)
	}
	m := map[string]registryJSON{}
	for _, h := range list.Hosts {
		m[h.Host] = h
	}
	return m
}

type registryJSON struct {
	Host      string            `json:"host"`
	Kind      string            `json:"kind"`
	Serves    []string          `json:"serves"`
	RetryAt   string            `json:"retryAt"`
	State     string            `json:"state"`
	LastError string            `json:"lastError"`
	NextProbe string            `json:"nextProbe"`
	Failures  int               `json:"failures"`
	Requests  map[string]uint64 `json:"requests"`
}

func endpointOf(r *registry.Registry) string { return r.URL() + "/v2" }

func seededImages(e *env, prefix string, n int) []string {
	refs := make([]string, n)
	for i := range refs {
		refs[i] = e.push(fmt.Sprintf("%s/img%d", prefix, i), "v1", registry.Image{Layers: []int64{16 << 10}, Seed: int64(900 + i)}).Ref
	}
	return refs
}

// TestRegistryHealthSkipsFailedMirror: a mirror that answers 503 or refuses
// connections costs one request in the first pull and none in the next
// pulls, all of which succeed from upstream.
func TestRegistryHealthSkipsFailedMirror(t *testing.T) {
	forEachCRIPullConfig(t, testRegistryHealthSkipsFailedMirror)
}

func testRegistryHealthSkipsFailedMirror(t *testing.T, criImages string) {
	for _, tc := range []struct {
		name    string
		breakIt func(e *env)
		outcome string
		lastErr string
	}{
		{"503", func(e *env) {
			e.mirror.SetFault(func(registry.Request) *registry.Fault { return &registry.Fault{Status: 503} })
		}, "server_error", "503 Service Unavailable"},
		{"refused", func(e *env) {
			e.writeHostsFor(e.upstream.Host(), e.upstream.URL(), "http://"+freeLoopback(e.t), "pull", "resolve")
		}, "unreachable", "connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{criImages: criImages, mirror: mirrorSeeded, extraConfig: healthConfig(time.Hour, time.Hour, 0, 0)})
			refs := seededImages(e, "skip", 5)
			tc.breakIt(e)
			mirrorEP := endpointOf(e.mirror)
			if tc.name == "refused" {
				mirrorEP = ""
			}
			for _, ref := range refs[:4] {
				e.criPull(ref)
			}
			// ctr shares the node's memory with CRI.
			if out, err := e.ctr("default", "image", "pull", "--plain-http", "--hosts-dir", e.hostsDir, refs[4]); err != nil {
				t.Fatalf("ctr pull: %v\n%s", err, out)
			}
			if tc.name == "503" {
				if n := e.mirror.Count(isContainerd); n != 1 {
					t.Fatalf("the 503 mirror got %d requests over 4 CRI pulls and a ctr pull, want 1", n)
				}
			}
			// The node's view: one failure, skipped since, no request lost.
			var mirror registryJSON
			for host, r := range e.registries() {
				if host != endpointOf(e.upstream) && (mirrorEP == "" || host == mirrorEP) {
					mirror = r
				}
			}
			if mirror.State != "down" || !strings.Contains(mirror.LastError, tc.lastErr) || mirror.NextProbe == "" {
				t.Fatalf("mirror in pullctl registries: %+v", mirror)
			}
			if mirror.Requests[tc.outcome] != 1 || mirror.Requests["skipped"] < 4 {
				t.Fatalf("mirror requests %v: want 1 %s and every later request skipped", mirror.Requests, tc.outcome)
			}
			if got := e.metric(fmt.Sprintf(`pullwise_registry_host_up{host=%q}`, mirror.Host)); got != 0 {
				t.Fatalf("pullwise_registry_host_up for the mirror = %v", got)
			}
			if got := e.metric(fmt.Sprintf(`pullwise_registry_requests_total{host=%q,outcome="skipped"}`, mirror.Host)); got < 3 {
				t.Fatalf("skipped requests metric = %v", got)
			}
			if got := e.metric(fmt.Sprintf(`pullwise_registry_host_up{host=%q}`, endpointOf(e.upstream))); got != 1 {
				t.Fatalf("upstream up = %v", got)
			}
			// One log line for the change of state, not one per request.
			if n := strings.Count(e.d.Log(), "registry host failed; skipping it"); n != 1 {
				t.Fatalf("%d state-change log lines, want 1", n)
			}
		})
	}
}

// TestRegistryHealthStalledMirror: a mirror that accepts and never answers
// costs one registry_response_timeout in the first pull and nothing after.
func TestRegistryHealthStalledMirror(t *testing.T) {
	const timeout = 2 * time.Second
	e := newEnv(t, envOptions{mirror: mirrorSeeded, extraConfig: healthConfig(time.Hour, time.Hour, timeout, 0)})
	refs := seededImages(e, "stall", 2)
	e.mirror.SetFault(func(registry.Request) *registry.Fault { return &registry.Fault{Delay: time.Hour} })

	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	for _, ref := range refs {
		if _, err := e.images.PullImage(ctx, criImage(ref), nil, nil); err != nil {
			t.Fatalf("pull %s behind a stalled mirror: %v", ref, err)
		}
	}
	if err := e.mirror.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	reqs := e.mirror.Requests()
	if len(reqs) != 1 {
		t.Fatalf("stalled mirror got %d requests over 2 pulls, want 1", len(reqs))
	}
	// containerd gave up on it when registry_response_timeout ran out.
	// (The registry saw the request start a little after containerd
	// started its clock.)
	if d := reqs[0].Duration(); d < timeout-500*time.Millisecond || d > timeout+5*time.Second {
		t.Fatalf("the stalled request lasted %s, want about %s", d, timeout)
	}
	if r := e.registries()[endpointOf(e.mirror)]; r.State != "down" || r.LastError != "no response within 2s" {
		t.Fatalf("mirror %+v", r)
	}
}

// TestRegistryHealthMirrorRecovers: after its cooldown one request probes
// the mirror, and once it answers pulls use it again.
func TestRegistryHealthMirrorRecovers(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded, extraConfig: healthConfig(time.Second, time.Second, 0, 0)})
	refs := seededImages(e, "recover", 3)
	e.mirror.SetFault(func(registry.Request) *registry.Fault { return &registry.Fault{Status: 503} })
	e.criPull(refs[0])
	e.mirror.SetFault(nil) // it is back, but the node does not know yet
	e.mirror.Reset()
	e.criPull(refs[1])
	if n := e.mirror.Count(isContainerd); n != 0 {
		t.Fatalf("mirror asked %d times during its cooldown", n)
	}
	eventually(t, 10*time.Second, "the mirror's cooldown to end", func() bool {
		next, err := time.Parse(time.RFC3339Nano, e.registries()[endpointOf(e.mirror)].NextProbe)
		return err == nil && time.Now().After(next)
	})
	e.criPull(refs[2])
	pushed := strings.TrimPrefix(refs[2], e.upstream.Host()+"/")
	if got := e.imageLabels("k8s.io", refs[2])[pullSourceLabel]; got != e.mirror.Host()+"/"+pushed {
		t.Fatalf("pull after the cooldown came from %q, want the mirror", got)
	}
	if r := e.registries()[endpointOf(e.mirror)]; r.State != "up" {
		t.Fatalf("mirror %+v after a successful probe", r)
	}
	if !strings.Contains(e.d.Log(), "registry host is healthy again") {
		t.Fatal("no log line for the recovery")
	}
}

// TestRegistryHealthMirror404IsAnAnswer: a mirror without one repository
// still serves the others.
func TestRegistryHealthMirror404IsAnAnswer(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded, extraConfig: healthConfig(time.Hour, time.Hour, 0, 0)})
	refs := seededImages(e, "answer", 2)
	missing := strings.TrimPrefix(strings.TrimSuffix(refs[0], ":v1"), e.upstream.Host()+"/")
	e.mirror.SetFault(registry.When(func(r registry.Request) bool { return r.Repo == missing }, &registry.Fault{Status: 404}))
	e.criPull(refs[0])
	e.criPull(refs[1])
	other := strings.TrimPrefix(refs[1], e.upstream.Host()+"/")
	if got := e.imageLabels("k8s.io", refs[1])[pullSourceLabel]; got != e.mirror.Host()+"/"+other {
		t.Fatalf("second repository came from %q, want the mirror", got)
	}
	if r := e.registries()[endpointOf(e.mirror)]; r.State != "up" || r.Requests["answer"] == 0 {
		t.Fatalf("mirror %+v", r)
	}
}

// TestRegistryHealthBlobCutResumesOnUpstream: a layer cut off half-way on
// the mirror completes from upstream with a range request; no byte is
// fetched twice.
func TestRegistryHealthBlobCutResumesOnUpstream(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded, extraConfig: healthConfig(time.Hour, time.Hour, 0, 0)})
	pushed := e.push("cut/app", "v1", registry.Image{Layers: []int64{4 << 20}, Seed: 950})
	layer, size := pushed.Layers[0], pushed.LayerSizes[0]
	cut := size / 2
	e.mirror.SetFault(registry.When(func(r registry.Request) bool {
		return r.Kind == registry.KindBlob && r.Reference == layer.String() && r.Method == http.MethodGet
	}, &registry.Fault{TruncateAfter: cut}))
	e.criPull(pushed.Ref)

	ctx := context.Background()
	for _, r := range []*registry.Registry{e.mirror, e.upstream} {
		if err := r.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var fromMirror, fromUpstream int64
	var ranges []string
	for _, r := range e.mirror.Requests() {
		if r.Kind == registry.KindBlob && r.Reference == layer.String() {
			fromMirror += r.Bytes
		}
	}
	for _, r := range e.upstream.Requests() {
		if r.Kind == registry.KindBlob && r.Reference == layer.String() && r.Method == http.MethodGet {
			fromUpstream += r.Bytes
			ranges = append(ranges, r.Header.Get("Range"))
		}
	}
	if want := []string{fmt.Sprintf("bytes=%d-", cut)}; fmt.Sprint(ranges) != fmt.Sprint(want) {
		t.Fatalf("upstream layer requests with ranges %q, want %q", ranges, want)
	}
	if fromMirror != cut || fromMirror+fromUpstream != size {
		t.Fatalf("layer of %d bytes: %d from the mirror, %d from upstream", size, fromMirror, fromUpstream)
	}
	if r := e.registries()[endpointOf(e.mirror)]; r.State != "down" {
		t.Fatalf("mirror %+v after cutting a blob", r)
	}
}

// TestRegistryHealthAllHostsFail: when no host serves, the error names each
// host and its answer, with a gRPC code from the answers, through CRI and
// through pullctl.
func TestRegistryHealthAllHostsFail(t *testing.T) {
	answer := func(code int) registry.FaultFunc {
		return func(registry.Request) *registry.Fault { return &registry.Fault{Status: code} }
	}
	for _, tc := range []struct {
		name             string
		mirror, upstream registry.FaultFunc
		deadUpstream     bool
		code             codes.Code
		answers          string // with MIRROR and UPSTREAM for the hosts
	}{
		{"503 and refused", answer(503), nil, true, codes.Unavailable,
			"mirror MIRROR: 503 Service Unavailable; upstream UPSTREAM: dial tcp UPSTREAM: connect: connection refused"},
		{"both 503", answer(503), answer(503), false, codes.Unavailable,
			"mirror MIRROR: 503 Service Unavailable; upstream UPSTREAM: 503 Service Unavailable"},
		{"both 404", answer(404), answer(404), false, codes.NotFound,
			"mirror MIRROR: 404 Not Found; upstream UPSTREAM: 404 Not Found"},
		{"401", answer(404), func(registry.Request) *registry.Fault {
			return &registry.Fault{RequireBasicAuth: &registry.BasicAuth{User: "u", Password: "p"}}
		}, false, codes.Unauthenticated,
			"mirror MIRROR: 404 Not Found; upstream UPSTREAM: 401 Unauthorized"},
		{"403", answer(503), answer(403), false, codes.PermissionDenied,
			"mirror MIRROR: 503 Service Unavailable; upstream UPSTREAM: 403 Forbidden"},
		{"429", answer(503), answer(429), false, codes.ResourceExhausted,
			"mirror MIRROR: 503 Service Unavailable; upstream UPSTREAM: 429 Too Many Requests"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{mirror: mirrorSeeded})
			ref := e.push("fail/app", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 960}).Ref
			upstreamHost := e.upstream.Host()
			if tc.deadUpstream {
				upstreamHost = freeLoopback(t)
				e.writeHostsFor(e.upstream.Host(), "http://"+upstreamHost, e.mirror.URL(), "pull", "resolve")
			}
			e.mirror.SetFault(tc.mirror)
			e.upstream.SetFault(tc.upstream)
			want := "all registries failed for " + ref + ": " +
				strings.NewReplacer("MIRROR", e.mirror.Host(), "UPSTREAM", upstreamHost).Replace(tc.answers)

			_, err := e.images.PullImage(context.Background(), criImage(ref), nil, nil)
			if st, _ := status.FromError(err); st.Code() != tc.code || !strings.Contains(st.Message(), want) {
				t.Fatalf("CRI PullImage: %v\nwant code %s and a message with\n%s", err, tc.code, want)
			}
			// The second pull remembers the mirror: unless upstream failed
			// too, it skips the mirror and says so.
			out, err := e.pullctl("pull", ref)
			mirrorPart, upstreamPart, _ := strings.Cut(want, "; ")
			mirrorPart, _, _ = strings.Cut(mirrorPart, e.mirror.Host()+": ")
			if err == nil || !strings.Contains(out, mirrorPart) || !strings.Contains(out, "; "+upstreamPart) {
				t.Fatalf("pullctl pull: %v\n%s\nwant it to fail naming\n%s", err, out, want)
			}
			if strings.Contains(out, "cannot reach the runtime") {
				t.Fatalf("pullctl blames the runtime for the registries: %s", out)
			}
		})
	}
}

// TestRegistryHealthFlappingMirror: 50 concurrent pulls while the mirror
// flaps all succeed, and leave nothing behind in containerd.
func TestRegistryHealthFlappingMirror(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded, noKeepAlive: true,
		extraConfig: healthConfig(100*time.Millisecond, 400*time.Millisecond, 0, 0)})
	refs := seededImages(e, "flap", 50)
	e.listPulls()
	baseline := e.d.Goroutines(t)

	var n, faulted atomic.Int64
	e.mirror.SetFault(func(r registry.Request) *registry.Fault {
		// Down for every other window of 5 requests.
		if (n.Add(1)/5)%2 == 1 {
			faulted.Add(1)
			return &registry.Fault{Status: 503}
		}
		return nil
	})
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := e.images.PullImage(ctx, criImage(refs[i]), nil, nil); err != nil {
				errs <- fmt.Errorf("%s: %w", refs[i], err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if served := n.Load() - faulted.Load(); faulted.Load() == 0 || served == 0 {
		t.Fatalf("the mirror failed %d and served %d requests: it never flapped", faulted.Load(), served)
	}
	if pulls := e.listPulls(); len(pulls) != 0 {
		t.Fatalf("pulls left: %v", pulls)
	}
	eventually(t, 10*time.Second, fmt.Sprintf("goroutines back to baseline %d", baseline), func() bool {
		return e.d.Goroutines(t) <= baseline
	})
}

// TestRegistryHealthSharedWithIfNewerNotPresent: the digest check and pulls
// share one memory: a mirror the check found down is skipped by the next
// pull, and the reverse.
func TestRegistryHealthSharedWithIfNewerNotPresent(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded, extraConfig: healthConfig(time.Hour, time.Hour, 0, 0)})
	refs := seededImages(e, "shared", 3)
	e.criPull(refs[0]) // present, from a healthy mirror
	e.mirror.SetFault(func(registry.Request) *registry.Fault { return &registry.Fault{Status: 503} })
	e.mirror.Reset()

	// The check meets the failing mirror first ...
	resp, err := e.pullwise.PullImage(context.Background(), &api.PullImageRequest{
		Image: criImage(refs[0]), PullPolicy: api.PullPolicy_IF_NEWER_NOT_PRESENT})
	if err != nil || resp.GetPulled() || resp.GetReason() != "up-to-date" {
		t.Fatalf("IfNewerNotPresent check: %v %v", resp, err)
	}
	if n := e.mirror.Count(isContainerd); n != 1 {
		t.Fatalf("check asked the mirror %d times, want 1", n)
	}
	// ... and the next pulls skip it.
	e.criPull(refs[1])
	e.criPull(refs[2])
	if n := e.mirror.Count(isContainerd); n != 1 {
		t.Fatalf("mirror asked %d times in all, want only the check's request", n)
	}
	// The next check skips it too: one HEAD, at upstream.
	e.upstream.Reset()
	if _, err := e.pullwise.PullImage(context.Background(), &api.PullImageRequest{
		Image: criImage(refs[1]), PullPolicy: api.PullPolicy_IF_NEWER_NOT_PRESENT}); err != nil {
		t.Fatal(err)
	}
	if n := e.mirror.Count(isContainerd); n != 1 {
		t.Fatalf("mirror asked %d times after the second check", n)
	}
	if n := e.upstream.Count(isContainerd); n != 1 {
		t.Fatalf("upstream asked %d times by the check, want 1 HEAD", n)
	}
}
