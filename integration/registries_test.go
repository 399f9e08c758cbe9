package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// stockSibling starts stock containerd, built from the same module, on
// e's registries and hosts.toml, to count what it sends beside Pullwise.
func (e *env) stockSibling() *env {
	e.t.Helper()
	return e.sibling(daemon.Options{Binary: daemon.Bin("containerd-stock")})
}

// TestFailedPullOfPresentImage: a pull that fails at the registry costs the
// same requests whether the image is on the node or not, and no more than
// stock's. The fast path's resolve is the pull's: its error ends the pull,
// where Pullwise used to resolve a second time (10 requests against
// stock's 5 with a wrong password).
func TestFailedPullOfPresentImage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault *registry.Fault
		auth  *criapi.AuthConfig
		code  codes.Code
	}{
		{"wrong password", &registry.Fault{RequireBasicAuth: &registry.BasicAuth{User: "u", Password: "p"}},
			&criapi.AuthConfig{Username: "u", Password: "wrong"}, codes.Unauthenticated},
		{"503", &registry.Fault{Status: 503}, nil, codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			stock := e.stockSibling()
			present := e.push("cost/present", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 3100})
			fresh := e.push("cost/new", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 3101})
			for _, d := range []*env{e, stock} {
				if _, err := d.images.PullImage(context.Background(), criImage(present.Ref), nil, nil); err != nil {
					t.Fatal(err)
				}
			}
			e.upstream.SetFault(func(registry.Request) *registry.Fault { return tc.fault })

			count := func(d *env, ref string) int {
				reqs, err := d.requestsOfPull(ref, tc.auth)
				if err == nil {
					t.Fatalf("pull of %s succeeded under %s", ref, tc.name)
				}
				if d == e && status.Code(err) != tc.code {
					t.Errorf("Pullwise's pull of %s: %v, want code %s", ref, err, tc.code)
				}
				return len(reqs)
			}
			stockPresent, stockNew := count(stock, present.Ref), count(stock, fresh.Ref)
			pwPresent, pwNew := count(e, present.Ref), count(e, fresh.Ref)
			t.Logf("requests per failed pull: stock %d (present) %d (new), Pullwise %d (present) %d (new)",
				stockPresent, stockNew, pwPresent, pwNew)
			if pwPresent != pwNew || pwPresent > stockPresent {
				t.Fatalf("Pullwise sent %d requests for the present image, %d for a new one; stock %d", pwPresent, pwNew, stockPresent)
			}
		})
	}
}

// TestBearerTokenOncePerPull: a pull behind max_parallel_image_pulls
// resolves and fetches its manifest while it waits, then pulls. All of it
// shares one bearer token, fetched once, and no request of the pull is
// answered 401 but the first; stock fetches a token for its resolve and
// another for its fetch. A token fetch that fails is made again by the
// next request, as it was when each had its own.
func TestBearerTokenOncePerPull(t *testing.T) {
	for _, tc := range []struct {
		name        string
		failing     int // token fetches answered 503 first
		wantFetches int
	}{
		{name: "one token", wantFetches: 1},
		{name: "the token service fails once", failing: 1, wantFetches: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
			tokens := registry.StartTokenServer(t, nil)
			const repo = "token/app"
			scope := "repository:" + repo + ":pull"
			img := e.push(repo, "v1", registry.Image{Layers: []int64{64 << 10, 32 << 10}, Seed: 3200})
			held := e.push("token/held", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 3201})
			e.upstream.SetFault(registry.When(func(r registry.Request) bool { return r.Repo == repo }, &registry.Fault{RequireBearer: tokens}))

			stockFetches := 0
			if tc.failing == 0 {
				stock := e.stockSibling()
				if _, err := stock.images.PullImage(context.Background(), criImage(img.Ref), nil, nil); err != nil {
					t.Fatalf("stock: %v", err)
				}
				stockFetches = tokens.Fetches(scope)
			}
			tokens.FailNext(tc.failing)

			// The held pull takes the one slot; the bearer pull waits
			// behind it and prefetches, which sizes it in ListPulls unless
			// its token fetch fails.
			release := e.upstream.HoldBlobs(t, func(r string) bool { return r == "token/held" })
			errs := make(chan error, 2)
			for _, ref := range []string{held.Ref, img.Ref} {
				go func() {
					_, err := e.images.PullImage(context.Background(), criImage(ref), nil, nil)
					errs <- err
				}()
				eventually(t, 10*time.Second, ref+" listed", func() bool {
					return slices.ContainsFunc(e.listPulls(), func(p *api.Pull) bool { return p.GetImage() == ref })
				})
			}
			eventually(t, 10*time.Second, "the waiting pull's prefetch", func() bool {
				return tokens.Fetches(scope) > stockFetches && slices.ContainsFunc(e.listPulls(), func(p *api.Pull) bool {
					return p.GetImage() == img.Ref && p.GetState() == "waiting" && (tc.failing > 0 || p.GetBytesTotal() > 0)
				})
			})
			e.upstream.Reset()
			release()
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			pwFetches := tokens.Fetches(scope) - stockFetches
			unauthorizedBlobs := e.upstream.Count(func(r registry.Request) bool {
				return r.Repo == repo && r.Kind == registry.KindBlob && r.Status == 401
			})
			t.Logf("token fetches: stock %d, Pullwise (queued, prefetched) %d; blob GETs answered 401 after the prefetch: %d",
				stockFetches, pwFetches, unauthorizedBlobs)
			if pwFetches != tc.wantFetches || unauthorizedBlobs != 0 || (tc.failing == 0 && pwFetches > stockFetches) {
				t.Fatalf("Pullwise fetched %d tokens (stock %d) and had %d blob GETs answered 401, want %d and none; fetches by scope: %s",
					pwFetches, stockFetches, unauthorizedBlobs, tc.wantFetches, tokens)
			}
		})
	}
}

// manifestRequests lists the manifest requests upstream saw, in order.
func manifestRequests(r *registry.Registry) []registry.Request {
	var out []registry.Request
	for _, req := range r.Requests() {
		if req.Kind == registry.KindManifest {
			out = append(out, req)
		}
	}
	return out
}

// TestRetryAfterHonoured: a 429 with Retry-After is asked again when it
// says, not a millisecond later as containerd would; stock's retry is
// measured beside it.
func TestRetryAfterHonoured(t *testing.T) {
	e := newEnv(t, envOptions{})
	stock := e.stockSibling()
	img := e.push("throttle/app", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 3300})

	gap := func(d *env) time.Duration {
		t.Helper()
		e.upstream.Reset()
		e.upstream.SetFault(registry.Times(2, registry.When(func(r registry.Request) bool { return r.Kind == registry.KindManifest },
			&registry.Fault{Status: 429, RetryAfter: time.Second})))
		defer e.upstream.SetFault(nil)
		if _, err := d.requestsOfPull(img.Ref, nil); err != nil {
			t.Fatalf("pull after two 429s: %v", err)
		}
		reqs := manifestRequests(e.upstream)
		if len(reqs) < 3 || reqs[0].Status != 429 || reqs[1].Status != 429 {
			t.Fatalf("manifest requests %v, want two 429s and a retry", reqs)
		}
		return min(reqs[1].Start.Sub(reqs[0].End), reqs[2].Start.Sub(reqs[1].End))
	}
	stockGap := gap(stock)
	if err := e.images.RemoveImage(context.Background(), criImage(img.Ref)); err != nil {
		t.Fatal(err)
	}
	pwGap := gap(e)
	t.Logf("shortest wait after a 429 with Retry-After: 1: stock %s, Pullwise %s", stockGap, pwGap)
	// The header says whole seconds; the wait is measured from the end of
	// the 429's response, a little after the client read it.
	if pwGap < 900*time.Millisecond {
		t.Fatalf("Pullwise asked again %s after a 429 with Retry-After: 1", pwGap)
	}
}

// TestRetryAfterShared: while one pull waits out a host's Retry-After,
// the other pulls to it wait too, and once it is over one request tries
// the host before the others follow.
func TestRetryAfterShared(t *testing.T) {
	e := newEnv(t, envOptions{})
	var refs []string
	for i := range 4 {
		refs = append(refs, e.push(fmt.Sprintf("shared/img%d", i), "v1", registry.Image{Layers: []int64{8 << 10}, Seed: int64(3400 + i)}).Ref)
	}
	const retryAfter = 3 * time.Second
	var answered atomic.Int64
	// The first request is throttled; the first after it is slow to
	// answer, so that requests that did not wait for it show.
	e.upstream.SetFault(func(registry.Request) *registry.Fault {
		switch answered.Add(1) {
		case 1:
			return &registry.Fault{Status: 429, RetryAfter: retryAfter}
		case 2:
			return &registry.Fault{Delay: 500 * time.Millisecond}
		}
		return nil
	})
	errs := make(chan error, len(refs))
	pull := func(ref string) {
		_, err := e.images.PullImage(context.Background(), criImage(ref), nil, nil)
		errs <- err
	}
	go pull(refs[0])
	// The registry has sent the 429 before the daemon has read it, and a
	// request sent in between cannot know of the wait: so the others
	// start once pullctl shows the host's wait, not once the registry
	// has answered.
	eventually(t, 10*time.Second, "the 429's wait in pullctl registries", func() bool {
		return e.registries()[endpointOf(e.upstream)].RetryAt != ""
	})
	for _, ref := range refs[1:] {
		go pull(ref)
	}
	for range refs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	reqs := e.upstream.Requests()
	throttled, retry, next := reqs[0], reqs[1], reqs[2]
	t.Logf("after the 429: the retry %s later, the next request %s after the retry began",
		retry.Start.Sub(throttled.End), next.Start.Sub(retry.Start))
	if throttled.Status != 429 || retry.Start.Sub(throttled.End) < retryAfter-100*time.Millisecond {
		t.Fatalf("a request went %s after the 429 that asked for %s: %v", retry.Start.Sub(throttled.End), retryAfter, reqs[:3])
	}
	if next.Start.Sub(retry.Start) < 400*time.Millisecond {
		t.Fatalf("a request went %s after the retry began, before its answer: %v", next.Start.Sub(retry.Start), reqs[:3])
	}
}

// TestRetryAfterTooLong: a host that asks for a wait longer than
// registry_max_retry_wait fails the pull at once with ResourceExhausted,
// naming the host and the wait, after one request where stock makes five.
func TestRetryAfterTooLong(t *testing.T) {
	e := newEnv(t, envOptions{})
	stock := e.stockSibling()
	img := e.push("limit/app", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 3500})
	e.upstream.SetFault(func(registry.Request) *registry.Fault {
		return &registry.Fault{Status: 429, RetryAfter: 2 * time.Minute}
	})
	stockReqs, _ := stock.requestsOfPull(img.Ref, nil)
	start := time.Now()
	reqs, err := e.requestsOfPull(img.Ref, nil)
	took := time.Since(start)
	t.Logf("requests for a pull told Retry-After: 120: stock %d, Pullwise %d, failing after %s: %v", len(stockReqs), len(reqs), took, err)
	want := e.upstream.Host() + ": not tried: 429 Too Many Requests, asked to wait 2m0s"
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), want) {
		t.Fatalf("pull: %v, want ResourceExhausted with %q", err, want)
	}
	if len(reqs) != 1 || len(reqs) > len(stockReqs) || took > 10*time.Second {
		t.Fatalf("Pullwise sent %d requests in %s (stock %d), want 1 and a quick answer", len(reqs), took, len(stockReqs))
	}
}

// TestStalledStorageHost: a blob GET redirected to a storage host that
// never answers fails on that host, which pullctl registries shows as
// down, as the storage of the registry; the registry stays up, serves the
// next pull's manifest, and is the pull source.
func TestStalledStorageHost(t *testing.T) {
	e := newEnv(t, envOptions{redirectBlobs: true, extraConfig: healthConfig(10*time.Second, time.Minute, time.Second, time.Second)})
	cdn := e.upstream.CDN()
	img := e.push("storage/app", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 3600})

	cdn.SetStall(true)
	_, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, nil)
	want := e.upstream.Host() + ": storage " + cdn.Host() + ": no response within 1s"
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), want) {
		t.Fatalf("pull through a stalled storage host: %v, want Unavailable naming %q", err, want)
	}
	hosts := e.registries()
	storage, registryHost := hosts["http://"+cdn.Host()], hosts[endpointOf(e.upstream)]
	if storage.Kind != "storage" || storage.State != "down" || !slices.Equal(storage.Serves, []string{endpointOf(e.upstream)}) {
		t.Fatalf("the storage host in pullctl registries: %+v", storage)
	}
	if registryHost.Kind != "registry" || registryHost.State != "up" {
		t.Fatalf("the registry in pullctl registries: %+v, want up", registryHost)
	}
	out, err := e.pullctl("registries")
	if err != nil || !strings.Contains(out, "storage of "+endpointOf(e.upstream)) {
		t.Fatalf("pullctl registries (err %v):\n%s", err, out)
	}

	// The registry answers the next pull's manifest requests at once: it
	// was never marked down. The storage host is tried again, as the only
	// way to the blob, and serves.
	cdn.SetStall(false)
	e.upstream.Reset()
	if _, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, nil); err != nil {
		t.Fatalf("pull once the storage host is back: %v", err)
	}
	if n := e.upstream.Count(func(r registry.Request) bool { return r.Kind == registry.KindManifest && r.Status == 200 }); n == 0 {
		t.Fatal("the registry served no manifest to the second pull")
	}
	e.assertSource(img.Ref, img, img.Ref)
}
