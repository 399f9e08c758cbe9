package integration

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// stockSibling starts stock containerd, built from the same module, on
// e's registries and hosts.toml, to count what it sends beside Pullwise.
func (e *env) stockSibling() *env {
	e.t.Helper()
	return e.sibling(daemon.Options{Binary: daemon.Bin("containerd-stock")})
}

// requestsOfPull counts what upstream saw for one CRI pull of ref with
// auth, and returns the pull's error.
func (e *env) requestsOfPull(ref string, auth *criapi.AuthConfig) ([]registry.Request, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.upstream.WaitIdle(ctx); err != nil {
		e.t.Fatal(err)
	}
	e.upstream.Reset()
	_, err := e.images.PullImage(ctx, criImage(ref), auth, nil)
	if err := e.upstream.WaitIdle(ctx); err != nil {
		e.t.Fatal(err)
	}
	return e.upstream.Requests(), err
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
// another for its fetch.
func TestBearerTokenOncePerPull(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	stock := e.stockSibling()
	tokens := registry.StartTokenServer(t, nil)
	const repo = "token/app"
	scope := "repository:" + repo + ":pull"
	e.upstream.SetFault(registry.When(func(r registry.Request) bool { return r.Repo == repo }, &registry.Fault{RequireBearer: tokens}))
	img := e.push(repo, "v1", registry.Image{Layers: []int64{64 << 10, 32 << 10}, Seed: 3200})
	held := e.push("token/held", "v1", registry.Image{Layers: []int64{8 << 10}, Seed: 3201})

	if _, err := stock.images.PullImage(context.Background(), criImage(img.Ref), nil, nil); err != nil {
		t.Fatalf("stock: %v", err)
	}
	stockFetches := tokens.Fetches(scope)

	// The held pull takes the one slot; the bearer pull waits behind it
	// and prefetches, which sizes it in ListPulls.
	release := e.upstream.HoldBlobs(t, func(r string) bool { return r == "token/held" })
	errs := make(chan error, 2)
	for _, ref := range []string{held.Ref, img.Ref} {
		go func() {
			_, err := e.images.PullImage(context.Background(), criImage(ref), nil, nil)
			errs <- err
		}()
		eventually(t, 10*time.Second, ref+" listed", func() bool {
			for _, p := range e.listPulls() {
				if p.GetImage() == ref {
					return true
				}
			}
			return false
		})
	}
	eventually(t, 10*time.Second, "the waiting pull sized by its prefetch", func() bool {
		for _, p := range e.listPulls() {
			if p.GetImage() == img.Ref && p.GetState() == "waiting" && p.GetBytesTotal() > 0 {
				return true
			}
		}
		return false
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
	t.Logf("token fetches per pull: stock %d, Pullwise (queued, prefetched) %d; blob GETs answered 401 after the prefetch: %d",
		stockFetches, pwFetches, unauthorizedBlobs)
	if pwFetches != 1 || pwFetches > stockFetches || unauthorizedBlobs != 0 {
		t.Fatalf("Pullwise fetched %d tokens (stock %d) and had %d blob GETs answered 401, want 1 token and none",
			pwFetches, stockFetches, unauthorizedBlobs)
	}
}

