package pinning

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/internal/await"
)

const (
	reg      = "registry.example.com"
	pause310 = reg + "/pause:3.10"
	pause311 = reg + "/pause:3.11"
	app      = reg + "/app:1"
)

var (
	pauseDigestRef    = reg + "/pause@" + pauseManifest.String()
	newPauseDigestRef = reg + "/pause@" + newPauseManifest.String()
	managed           = map[string]string{"io.cri-containerd.image": "managed"}
)

func TestReconcile(t *testing.T) {
	for _, tc := range []struct {
		name         string
		config       map[string]string
		records      []record
		want         map[string]map[string]string // labels after, by name; nil: no labels
		wantPinned   []string
		wantUnpinned []string
	}{
		{
			name:   "tag, repo digest and image ID records of the named image",
			config: map[string]string{"sandbox": pause310},
			records: []record{
				{name: pause310, target: pauseManifest},
				{name: pauseDigestRef, target: pauseManifest},
				{name: pauseID, target: pauseManifest},
				{name: app, target: appManifest},
			},
			want: map[string]map[string]string{
				pause310: pinnedByConfig, pauseDigestRef: pinnedByConfig, pauseID: pinnedByConfig, app: nil,
			},
			wantPinned: []string{pause310, pauseDigestRef, pauseID},
		},
		{
			name:       "short config name",
			config:     map[string]string{"sandbox": "pause:3.10"},
			records:    []record{{name: "docker.io/library/pause:3.10", target: pauseManifest}},
			want:       map[string]map[string]string{"docker.io/library/pause:3.10": pinnedByConfig},
			wantPinned: []string{"docker.io/library/pause:3.10"},
		},
		{
			name:       "config without tag names latest",
			config:     map[string]string{"sandbox": reg + "/pause"},
			records:    []record{{name: reg + "/pause:latest", target: pauseManifest}},
			want:       map[string]map[string]string{reg + "/pause:latest": pinnedByConfig},
			wantPinned: []string{reg + "/pause:latest"},
		},
		{
			name:   "config by digest pins records with that target",
			config: map[string]string{"sandbox": pauseDigestRef},
			records: []record{
				{name: pause310, target: pauseManifest},
				{name: pauseID, target: pauseManifest},
				{name: pause311, target: newPauseManifest},
			},
			want:       map[string]map[string]string{pause310: pinnedByConfig, pauseID: pinnedByConfig, pause311: nil},
			wantPinned: []string{pause310, pauseID},
		},
		{
			name:   "other labels survive pinning",
			config: map[string]string{"sandbox": pause310},
			records: []record{
				{name: pause310, target: pauseManifest, labels: with(managed, map[string]string{"io.pullwise.pull-source": pause310})},
			},
			want: map[string]map[string]string{
				pause310: with(with(managed, map[string]string{"io.pullwise.pull-source": pause310}), pinnedByConfig),
			},
			wantPinned: []string{pause310},
		},
		{
			name:   "config moved on: marked pins removed, other labels kept",
			config: map[string]string{"sandbox": pause311},
			records: []record{
				{name: pause310, target: pauseManifest, labels: with(managed, pinnedByConfig)},
				{name: pauseID, target: pauseManifest, labels: with(managed, pinnedByConfig)},
				{name: pause311, target: newPauseManifest, labels: managed},
			},
			want: map[string]map[string]string{
				pause310: managed, pauseID: managed, pause311: with(managed, pinnedByConfig),
			},
			wantPinned:   []string{pause311},
			wantUnpinned: []string{pause310, pauseID},
		},
		{
			name:    "hand pin on an image config does not name is left alone",
			config:  map[string]string{"sandbox": pause310},
			records: []record{{name: app, target: appManifest, labels: with(managed, pinnedByHand)}},
			want:    map[string]map[string]string{app: with(managed, pinnedByHand)},
		},
		{
			// Upstream CRI pins exact config names without a marker; unless
			// claimed, that pin would outlive the config naming it.
			name:       "unmarked pin on a named image is claimed",
			config:     map[string]string{"sandbox": pause310},
			records:    []record{{name: pause310, target: pauseManifest, labels: pinnedByHand}},
			want:       map[string]map[string]string{pause310: pinnedByConfig},
			wantPinned: []string{pause310},
		},
		{
			name:       "pin label removed by hand is restored",
			config:     map[string]string{"sandbox": pause310},
			records:    []record{{name: pause310, target: pauseManifest, labels: map[string]string{MarkerLabel: MarkerValue}}},
			want:       map[string]map[string]string{pause310: pinnedByConfig},
			wantPinned: []string{pause310},
		},
		{
			name:   "tag moved: the old image's other names are unpinned",
			config: map[string]string{"sandbox": pause310},
			records: []record{
				{name: pause310, target: newPauseManifest},
				{name: pauseDigestRef, target: pauseManifest, labels: pinnedByConfig},
				{name: pauseID, target: pauseManifest, labels: pinnedByConfig},
				{name: newPauseDigestRef, target: newPauseManifest},
				{name: newPauseID, target: newPauseManifest},
			},
			want: map[string]map[string]string{
				pause310: pinnedByConfig, newPauseDigestRef: pinnedByConfig, newPauseID: pinnedByConfig,
				pauseDigestRef: nil, pauseID: nil,
			},
			wantPinned:   []string{pause310, newPauseDigestRef, newPauseID},
			wantUnpinned: []string{pauseDigestRef, pauseID},
		},
		{
			name:   "other namespaces are not CRI's",
			config: map[string]string{"sandbox": pause310},
			records: []record{
				{ns: "default", name: pause310, target: pauseManifest},
				{ns: "default", name: app, target: appManifest, labels: pinnedByConfig},
			},
		},
		{
			name:    "nothing configured unpins only marked pins",
			config:  map[string]string{},
			records: []record{{name: pause310, target: pauseManifest, labels: pinnedByConfig}, {name: app, target: appManifest, labels: pinnedByHand}},
			want:    map[string]map[string]string{pause310: nil, app: pinnedByHand},
			// Unpinned, although CRI would not have pinned it without config.
			wantUnpinned: []string{pause310},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestStore(t)
			for _, r := range tc.records {
				s.create(t, r)
			}
			pins, err := NewPins(tc.config)
			if err != nil {
				t.Fatal(err)
			}
			r := NewReconciler(s, pins)
			changes, err := r.Reconcile(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !sameSet(changes.Pinned, tc.wantPinned) || !sameSet(changes.Unpinned, tc.wantUnpinned) {
				t.Errorf("changes = %+v, want pinned %v, unpinned %v", changes, tc.wantPinned, tc.wantUnpinned)
			}
			for _, rec := range tc.records {
				want := tc.want[rec.name]
				if rec.ns != "" {
					want = rec.labels // untouched
				}
				if got := s.labels(t, rec.ns, rec.name); !maps.Equal(got, orNone(want)) {
					t.Errorf("%s/%s labels = %v, want %v", or(rec.ns, criconfig.Namespace), rec.name, got, want)
				}
			}

			// A second pass finds nothing to do and writes nothing: each
			// write would publish an event and trigger yet another pass.
			before := updatedAt(t, s)
			changes, err = r.Reconcile(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(changes.Pinned)+len(changes.Unpinned) > 0 {
				t.Errorf("second pass changed %+v", changes)
			}
			if after := updatedAt(t, s); !maps.Equal(before, after) {
				t.Errorf("second pass wrote records: before %v, after %v", before, after)
			}
		})
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func orNone(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func updatedAt(t *testing.T, s *testStore) map[string]time.Time {
	t.Helper()
	imgs, err := s.List(nsCtx(criconfig.Namespace))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]time.Time{}
	for _, img := range imgs {
		m[img.Name] = img.UpdatedAt
	}
	return m
}

// watch runs Watch until the test ends and fails the test if Watch does not
// end cleanly.
func watch(t *testing.T, r *Reconciler, sub events.Subscriber) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx, sub) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Watch did not return after its context ended")
		}
	})
}

// within polls until the record's labels equal want, failing after d.
func within(t *testing.T, d time.Duration, s *testStore, ns, name string, want map[string]string) {
	t.Helper()
	var got map[string]string
	if !await.Within(d, func() bool {
		got = s.labels(t, ns, name)
		return maps.Equal(got, want)
	}) {
		t.Fatalf("%s labels after %s: %v, want %v", name, d, got, want)
	}
}

func TestWatchFollowsImageEvents(t *testing.T) {
	s := newTestStore(t)
	// Present before Watch starts.
	s.create(t, record{name: pause310, target: pauseManifest, labels: managed})
	pins, err := NewPins(map[string]string{"sandbox": pause310})
	if err != nil {
		t.Fatal(err)
	}
	watch(t, NewReconciler(s, pins), s.events)
	within(t, time.Second, s, "", pause310, with(managed, pinnedByConfig))

	// A record CRI adds after the pull, the image ID, pinned by its target.
	s.create(t, record{name: pauseID, target: pauseManifest})
	within(t, time.Second, s, "", pauseID, pinnedByConfig)

	// A re-pull through the transfer service replaces the record whole,
	// labels included.
	if _, err := s.Update(nsCtx(""), images.Image{Name: pause310, Target: target(pauseManifest)}); err != nil {
		t.Fatal(err)
	}
	within(t, time.Second, s, "", pause310, pinnedByConfig)

	// The same name elsewhere is not CRI's: after a later event in k8s.io
	// has been handled, it is still unpinned.
	s.create(t, record{ns: "default", name: pause310, target: pauseManifest})
	s.create(t, record{name: pauseDigestRef, target: pauseManifest})
	within(t, time.Second, s, "", pauseDigestRef, pinnedByConfig)
	if got := s.labels(t, "default", pause310); len(got) != 0 {
		t.Fatalf("record in namespace default got labels %v", got)
	}

	// Deleting the named record leaves its other names unnamed by config.
	if err := s.Delete(nsCtx(""), pause310); err != nil {
		t.Fatal(err)
	}
	within(t, time.Second, s, "", pauseID, map[string]string{})
	within(t, time.Second, s, "", pauseDigestRef, map[string]string{})
}

// failingStore fails the first n label updates.
type failingStore struct {
	*testStore
	failures atomic.Int32
}

func (s *failingStore) Update(ctx context.Context, img images.Image, fieldpaths ...string) (images.Image, error) {
	if s.failures.Add(-1) >= 0 {
		return images.Image{}, errors.New("disk on fire")
	}
	return s.testStore.Update(ctx, img, fieldpaths...)
}

func TestWatchRetriesFailedPass(t *testing.T) {
	s := &failingStore{testStore: newTestStore(t)}
	s.failures.Store(1)
	s.create(t, record{name: pause310, target: pauseManifest})
	pins, err := NewPins(map[string]string{"sandbox": pause310})
	if err != nil {
		t.Fatal(err)
	}
	// No event follows the failed first pass: only the retry can pin.
	watch(t, NewReconciler(s, pins), s.events)
	within(t, retryDelay+time.Second, s.testStore, "", pause310, pinnedByConfig)
}

func TestReconcileReportsFailedUpdates(t *testing.T) {
	s := &failingStore{testStore: newTestStore(t)}
	s.failures.Store(1)
	s.create(t, record{name: pause310, target: pauseManifest})
	s.create(t, record{name: pauseID, target: pauseManifest})
	pins, err := NewPins(map[string]string{"sandbox": pause310})
	if err != nil {
		t.Fatal(err)
	}
	changes, err := NewReconciler(s, pins).Reconcile(context.Background())
	// Records are listed by name: pause310 comes first and fails.
	if err == nil || !strings.Contains(err.Error(), `"`+pause310+`"`) || !strings.Contains(err.Error(), "disk on fire") {
		t.Fatalf("Reconcile error %v does not name the failed record and cause", err)
	}
	if !slices.Equal(changes.Pinned, []string{pauseID}) {
		t.Fatalf("pinned %v, want the other record pinned despite the failure", changes.Pinned)
	}
}

// closedSubscriber is an event source whose subscription ends at once.
type closedSubscriber struct{ err error }

func (c closedSubscriber) Subscribe(context.Context, ...string) (<-chan *events.Envelope, <-chan error) {
	errs := make(chan error, 1)
	errs <- c.err
	close(errs)
	return make(chan *events.Envelope), errs
}

func TestWatchEndsWithItsSubscription(t *testing.T) {
	pins, err := NewPins(nil)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err = NewReconciler(newTestStore(t), pins).Watch(context.Background(), closedSubscriber{err: boom})
	if !errors.Is(err, boom) {
		t.Fatalf("Watch = %v, want the subscription's error", err)
	}
}

// listingStore counts full listings.
type listingStore struct {
	*testStore
	lists atomic.Int32
}

func (s *listingStore) List(ctx context.Context, filters ...string) ([]images.Image, error) {
	s.lists.Add(1)
	return s.testStore.List(ctx, filters...)
}

// TestEventsThatConcernPins: after a pass, only an event about a record
// that is or may become pinned needs another; deciding costs a lookup by
// name, never a listing, so a burst of unrelated pulls stays linear.
func TestEventsThatConcernPins(t *testing.T) {
	s := &listingStore{testStore: newTestStore(t)}
	s.create(t, record{name: pause310, target: pauseManifest})
	s.create(t, record{name: pauseID, target: pauseManifest})
	s.create(t, record{name: reg + "/app:v1", target: digest.FromString("app")})
	s.create(t, record{name: reg + "/old:v1", target: digest.FromString("old"), labels: pinnedByConfig})
	pins, err := NewPins(map[string]string{"sandbox": pause310, "other": reg + "/absent:v1"})
	if err != nil {
		t.Fatal(err)
	}
	r := NewReconciler(s, pins)
	if _, err := r.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Created after the pass: an import of the pause image under another name.
	s.create(t, record{name: reg + "/imported:v1", target: pauseManifest})
	s.lists.Store(0)
	for _, tc := range []struct {
		name string
		want bool
	}{
		{reg + "/app:v1", false},     // unrelated
		{reg + "/gone:v1", false},    // unrelated and deleted
		{pause310, true},             // named by config
		{reg + "/absent:v1", true},   // named by config, not there yet
		{pauseID, true},              // pinned by target at the last pass
		{reg + "/imported:v1", true}, // new, with a pinned target
		{reg + "/old:v1", true},      // carries the marker: may need unpinning
	} {
		if got := r.concerns(context.Background(), tc.name); got != tc.want {
			t.Errorf("concerns(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
	if n := s.lists.Load(); n != 0 {
		t.Fatalf("deciding listed the store %d times", n)
	}
}
