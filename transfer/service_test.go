package transfer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	transfertypes "github.com/containerd/containerd/api/types/transfer"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/streaming"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/transfer/gate"
)

// fakeNext stands in for containerd's local transfer service. Pulls block
// until released, so tests control how long a pull holds its slot.
type fakeNext struct {
	mu      sync.Mutex
	calls   int
	err     error
	release chan struct{} // nil: return at once
	started chan string   // image of each pull as it starts, if set
}

func (f *fakeNext) Transfer(ctx context.Context, src, _ any, opts ...transfer.Opt) error {
	f.mu.Lock()
	f.calls++
	f.mu.Unlock()
	var cfg transfer.Config
	for _, o := range opts {
		o(&cfg)
	}
	// Progress first, so a test told the pull started also sees its bytes.
	if cfg.Progress != nil {
		cfg.Progress(transfer.Progress{Event: "downloading", Name: "layer-sha256:aa", Progress: 5, Total: 10})
	}
	if f.started != nil {
		f.started <- imageOf(src)
	}
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return f.err
}

func (f *fakeNext) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// fakeSource and fakeDest mimic registry.OCIRegistry and image.Store closely
// enough to be keyed: a name and a self-description.
type fakeSource struct {
	ref   string
	creds string // "" for none
}

func (s fakeSource) Image() string { return s.ref }
func (s fakeSource) Resolve(context.Context) (string, ocispec.Descriptor, error) {
	return s.ref, ocispec.Descriptor{}, nil
}
func (s fakeSource) Fetcher(context.Context, string) (transfer.Fetcher, error) { return nil, nil }
func (s fakeSource) MarshalAny(ctx context.Context, sm streaming.StreamCreator) (typeurl.Any, error) {
	res := &transfertypes.RegistryResolver{}
	if s.creds != "" {
		st, err := sm.Create(ctx, "creds")
		if err != nil {
			return nil, err
		}
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					return
				}
				a, _ := typeurl.MarshalAny(&transfertypes.AuthResponse{AuthType: transfertypes.AuthType_CREDENTIALS, Username: "u", Secret: s.creds})
				if st.Send(a) != nil {
					return
				}
			}
		}()
		res.AuthStream = "creds"
	}
	return typeurl.MarshalAny(&transfertypes.OCIRegistry{Reference: s.ref, Resolver: res})
}

type fakeDest struct{ name string }

func (d fakeDest) Store(context.Context, ocispec.Descriptor, images.Store) ([]images.Image, error) {
	return nil, nil
}
func (d fakeDest) MarshalAny(context.Context, streaming.StreamCreator) (typeurl.Any, error) {
	return typeurl.MarshalAny(&transfertypes.ImageStore{Name: d.name, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}})
}

func newService(t *testing.T, next transfer.Transferrer) *Service {
	t.Helper()
	s, err := New(next, Local{}, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func outcome(s *Service, o string) float64 {
	return testutil.ToFloat64(s.metrics.pulls.WithLabelValues(o))
}

func TestNonPullsPassThrough(t *testing.T) {
	next := &fakeNext{err: errors.New("boom")}
	s := newService(t, next)
	if err := s.Transfer(context.Background(), "archive", "store"); !errors.Is(err, next.err) {
		t.Fatalf("got %v", err)
	}
	if next.count() != 1 || outcome(s, OutcomePulled)+outcome(s, OutcomeFailed) != 0 {
		t.Fatalf("non-pull counted as a pull")
	}
}

func TestPullOutcomes(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"pulled", nil, OutcomePulled},
		{"failed", errors.New("boom"), OutcomeFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := &fakeNext{err: tc.err}
			s := newService(t, next)
			err := s.Transfer(context.Background(), fakeSource{ref: "example.com/a:1"}, fakeDest{name: "example.com/a:1"})
			if !errors.Is(err, tc.err) {
				t.Fatalf("got %v", err)
			}
			if outcome(s, tc.want) != 1 {
				t.Fatalf("%s not counted", tc.want)
			}
		})
	}
}

func TestIdenticalPullsShareOneTransfer(t *testing.T) {
	next := &fakeNext{release: make(chan struct{}), started: make(chan string, 10)}
	s := newService(t, next)
	const callers = 10
	errs := make(chan error, callers)
	for range callers {
		go func() {
			errs <- s.Transfer(context.Background(), fakeSource{ref: "example.com/a:1", creds: "x"}, fakeDest{name: "example.com/a:1"})
		}()
	}
	<-next.started
	await.Until(t, 5*time.Second, "all callers joined", func() bool { return s.group.Callers() == callers })
	close(next.release)
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if next.count() != 1 {
		t.Fatalf("%d transfers for %d identical pulls", next.count(), callers)
	}
	if outcome(s, OutcomeDeduped) != callers-1 || outcome(s, OutcomePulled) != 1 {
		t.Fatalf("deduped %v pulled %v", outcome(s, OutcomeDeduped), outcome(s, OutcomePulled))
	}
}

func TestDifferentCredentialsNeverShare(t *testing.T) {
	next := &fakeNext{release: make(chan struct{}), started: make(chan string, 2)}
	s := newService(t, next)
	errs := make(chan error, 2)
	for _, creds := range []string{"alice", "bob"} {
		go func() {
			errs <- s.Transfer(context.Background(), fakeSource{ref: "example.com/a:1", creds: creds}, fakeDest{name: "example.com/a:1"})
		}()
	}
	<-next.started
	<-next.started // both started: they did not share
	close(next.release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if outcome(s, OutcomeDeduped) != 0 {
		t.Fatal("pulls with different credentials were shared")
	}
}

func TestGateLimitsAndTimesOut(t *testing.T) {
	next := &fakeNext{release: make(chan struct{}), started: make(chan string, 5)}
	s := newService(t, next)
	// The bypass list names the sandbox image as the node's config may:
	// in full, or by a short name.
	s.Configure(Config{Gate: gate.New(1, 20*time.Millisecond), Bypass: []string{"example.com/pause:3.10", "pause:3.10", "docker.io/library/busybox:latest"}})

	first := make(chan error, 1)
	go func() {
		first <- s.Transfer(context.Background(), fakeSource{ref: "example.com/a:1"}, fakeDest{name: "a"})
	}()
	<-next.started
	if got := s.Pulls(); len(got) != 1 || got[0].State != StatePulling || got[0].BytesDone != 5 || got[0].BytesTotal != 10 {
		t.Fatalf("Pulls() = %+v", got)
	}

	err := s.Transfer(context.Background(), fakeSource{ref: "example.com/b:1"}, fakeDest{name: "b"})
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("queued pull got %v, want ResourceExhausted", err)
	}
	if outcome(s, OutcomeTimedOut) != 1 {
		t.Fatal("time-out not counted")
	}

	// The sandbox image skips the full queue (short name, normalized): the
	// bypass list and the pull's name are both normalized before they are
	// compared, so a short name matches its full form either way round
	// (pause:3.10 listed, docker.io/library/pause:3.10 pulled; busybox
	// pulled, docker.io/library/busybox:latest listed).
	skips := func(ref string) chan error {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			done <- s.Transfer(context.Background(), fakeSource{ref: ref}, fakeDest{name: ref})
		}()
		select {
		case got := <-next.started:
			if got != ref {
				t.Fatalf("started %s, want %s", got, ref)
			}
		case err := <-done:
			t.Fatalf("%s did not skip the full queue: %v", ref, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%s neither started nor failed within 10s", ref)
		}
		return done
	}
	var sandboxes []chan error
	for _, ref := range []string{"example.com/pause:3.10", "docker.io/library/pause:3.10", "busybox"} {
		sandboxes = append(sandboxes, skips(ref))
	}
	// Normalizing does not make names alike that are not: another tag of
	// a bypassed short name waits in the queue like any other pull.
	for _, ref := range []string{"busybox:1.36", "docker.io/library/pause:3.9"} {
		if err := s.Transfer(context.Background(), fakeSource{ref: ref}, fakeDest{name: ref}); !errors.Is(err, errdefs.ErrResourceExhausted) {
			t.Fatalf("%s got %v, want ResourceExhausted: it is not in the bypass list", ref, err)
		}
	}
	if n := outcome(s, OutcomeTimedOut); n != 3 {
		t.Fatalf("%v time-outs counted, want 3", n)
	}
	close(next.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for _, done := range sandboxes {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if len(s.Pulls()) != 0 {
		t.Fatalf("pulls left: %+v", s.Pulls())
	}
}

var (
	_ transfer.ImageFetcher = fakeSource{}
	_ transfer.ImageStorer  = fakeDest{}
)
