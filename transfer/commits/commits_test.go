package commits

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata/boltutil"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	bolt "go.etcd.io/bbolt"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/internal/lendtest"
	"github.com/pullwise/pullwise/transfer/lane"
)

// recordingImages is an image store that records the order of its
// writes, and holds the write of the image named hold until released.
type recordingImages struct {
	images.Store
	hold    string
	held    chan struct{} // closed when the held write starts
	release chan struct{}
	mu      sync.Mutex
	order   []string
}

func (s *recordingImages) Create(ctx context.Context, img images.Image) (images.Image, error) {
	return s.Update(ctx, img)
}

func (s *recordingImages) Update(ctx context.Context, img images.Image, _ ...string) (images.Image, error) {
	if s.hold != "" && img.Name == s.hold {
		close(s.held)
		<-s.release
	}
	s.mu.Lock()
	s.order = append(s.order, img.Name)
	s.mu.Unlock()
	return img, nil
}

// pullCtx is the context of a pull asked for at asked that costs cost.
func pullCtx(ctx context.Context, asked time.Time, cost time.Duration) context.Context {
	t := lane.NewTicket(asked)
	t.Need(cost)
	return lane.WithTicket(ctx, t)
}

// TestWritesInDueOrder: writes waiting for their turn go in due order,
// not in the order they came; a write of a cancelled pull still runs.
func TestWritesInDueOrder(t *testing.T) {
	now := time.Now()
	store := &recordingImages{hold: "holder", held: make(chan struct{}), release: make(chan struct{})}
	turns := New()
	imgs := Images{Store: store, Turns: turns}

	done := make(chan error, 4)
	write := func(ctx context.Context, name string) {
		go func() {
			_, err := imgs.Update(ctx, images.Image{Name: name})
			done <- err
		}()
	}
	write(context.Background(), "holder")
	<-store.held
	cancelled, cancel := context.WithCancel(pullCtx(context.Background(), now, time.Hour))
	cancel()
	for i, w := range []struct {
		ctx  context.Context
		name string
	}{
		{pullCtx(context.Background(), now, time.Minute), "large"},
		{cancelled, "cancelled"},
		{pullCtx(context.Background(), now, time.Second), "small"},
	} {
		write(w.ctx, w.name)
		await.Until(t, 10*time.Second, "the write to wait for its turn", func() bool { return turns.lane.Waiting() == i+1 })
	}
	close(store.release)
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"holder", "small", "large", "cancelled"}
	if len(store.order) != len(want) {
		t.Fatalf("writes %v, want %v", store.order, want)
	}
	for i := range want {
		if store.order[i] != want[i] {
			t.Fatalf("writes %v, want %v: in due order", store.order, want)
		}
	}
}

// fakeContent and fakeSnapshotter do each write at once; what is asked of
// them is whether they wait for their turn.
type fakeContent struct{ content.Store }

func (fakeContent) Update(_ context.Context, info content.Info, _ ...string) (content.Info, error) {
	return info, nil
}
func (fakeContent) Delete(context.Context, digest.Digest) error { return nil }
func (fakeContent) Writer(context.Context, ...content.WriterOpt) (content.Writer, error) {
	return fakeWriter{}, nil
}

type fakeWriter struct{ content.Writer }

func (fakeWriter) Commit(context.Context, int64, digest.Digest, ...content.Opt) error { return nil }

type fakeSnapshotter struct{ snapshots.Snapshotter }

func (fakeSnapshotter) Prepare(context.Context, string, string, ...snapshots.Opt) ([]mount.Mount, error) {
	return nil, nil
}
func (fakeSnapshotter) View(context.Context, string, string, ...snapshots.Opt) ([]mount.Mount, error) {
	return nil, nil
}
func (fakeSnapshotter) Commit(context.Context, string, string, ...snapshots.Opt) error { return nil }
func (fakeSnapshotter) Remove(context.Context, string) error                           { return nil }

// write is one of the stores' writes, run with ctx.
type write struct {
	name string
	run  func(ctx context.Context) error
}

// everyWrite is each write of the three stores, taking turns.
func everyWrite(t *testing.T, turns *Turns) []write {
	cs := Content{Store: fakeContent{}, Turns: turns}
	sn := Snapshotter{Snapshotter: fakeSnapshotter{}, Turns: turns}
	imgs := Images{Store: &recordingImages{}, Turns: turns}
	w, err := cs.Writer(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return []write{
		{"content Update", func(ctx context.Context) error { _, err := cs.Update(ctx, content.Info{}); return err }},
		{"content Delete", func(ctx context.Context) error { return cs.Delete(ctx, "") }},
		{"content Writer", func(ctx context.Context) error { _, err := cs.Writer(ctx); return err }},
		{"content Commit", func(ctx context.Context) error { return w.Commit(ctx, 0, "") }},
		{"snapshot Prepare", func(ctx context.Context) error { _, err := sn.Prepare(ctx, "k", ""); return err }},
		{"snapshot View", func(ctx context.Context) error { _, err := sn.View(ctx, "k", ""); return err }},
		{"snapshot Commit", func(ctx context.Context) error { return sn.Commit(ctx, "n", "k") }},
		{"snapshot Remove", func(ctx context.Context) error { return sn.Remove(ctx, "k") }},
		{"image Create", func(ctx context.Context) error { _, err := imgs.Create(ctx, images.Image{}); return err }},
		{"image Update", func(ctx context.Context) error { _, err := imgs.Update(ctx, images.Image{}); return err }},
	}
}

// TestEveryWriteTakesItsTurn: each write of the three stores waits while
// another holds the turn, and runs once it is given back.
func TestEveryWriteTakesItsTurn(t *testing.T) {
	turns := New()
	ctx := context.Background()
	for _, w := range everyWrite(t, turns) {
		t.Run(w.name, func(t *testing.T) {
			release, err := turns.lane.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- w.run(ctx) }()
			await.Until(t, 10*time.Second, "the write to wait for its turn", func() bool { return turns.lane.Waiting() == 1 })
			select {
			case err := <-done:
				t.Fatalf("the write ran while another held the turn: %v", err)
			default:
			}
			release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWriteInTheCallersTransactionRunsAtOnce: a write made within the
// caller's own bolt transaction does not wait for the turn. Its caller
// holds bolt's lock, which the holder of the turn may be waiting for.
func TestWriteInTheCallersTransactionRunsAtOnce(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	turns := New()
	for _, w := range everyWrite(t, turns) {
		t.Run(w.name, func(t *testing.T) {
			tx, err := db.Begin(true)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback()
			release, err := turns.lane.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			// Given back at the end, so that a write wrongly waiting ends
			// with the test.
			defer release()
			done := make(chan error, 1)
			go func() { done <- w.run(boltutil.WithTransaction(context.Background(), tx)) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the write within the caller's transaction waited for the turn")
			}
		})
	}
}

// TestWriteSeconds: pullwise_metadata_write_seconds splits each write's
// time into its wait for a turn and the write itself: a write that waited
// while another held the turn for a second shows that second as its turn,
// and the holder shows it as its write. Each took a second, and a debug
// line names its pull.
func TestWriteSeconds(t *testing.T) {
	var logged bytes.Buffer
	logger := logrus.New()
	logger.SetOutput(&logged)
	logger.SetLevel(logrus.DebugLevel)
	var mu sync.Mutex
	clock := time.Unix(0, 0)
	store := &recordingImages{hold: "holder", held: make(chan struct{}), release: make(chan struct{})}
	turns := New()
	turns.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return clock
	}
	imgs := Images{Store: store, Turns: turns}
	done := make(chan error, 2)
	for _, name := range []string{"holder", "waiter"} {
		ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger).WithField("image", name))
		go func() {
			_, err := imgs.Create(ctx, images.Image{Name: name})
			done <- err
		}()
		if name == "holder" {
			<-store.held
		}
	}
	await.Until(t, 10*time.Second, "the second write to wait for its turn", func() bool { return turns.lane.Waiting() == 1 })
	mu.Lock()
	clock = clock.Add(time.Second)
	mu.Unlock()
	close(store.release)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Each phase: one write at 0 s, one at 1 s, as a scrape shows them.
	var want strings.Builder
	want.WriteString("# HELP pullwise_metadata_write_seconds Pulls' writes to containerd's metadata database: the wait for their turn among the pulls' writes (phase=turn), and the write itself, with the wait for the database's one writer that other writes share (phase=write).\n")
	want.WriteString("# TYPE pullwise_metadata_write_seconds histogram\n")
	for _, phase := range []string{"turn", "write"} {
		for _, le := range []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, math.Inf(1)} {
			n := 1 // the write at 0 s
			if le >= 1 {
				n = 2
			}
			fmt.Fprintf(&want, "pullwise_metadata_write_seconds_bucket{phase=%q,le=%q} %d\n", phase, fmt.Sprint(le), n)
		}
		fmt.Fprintf(&want, "pullwise_metadata_write_seconds_sum{phase=%q} 1\n", phase)
		fmt.Fprintf(&want, "pullwise_metadata_write_seconds_count{phase=%q} 2\n", phase)
	}
	if err := testutil.CollectAndCompare(turns, strings.NewReader(want.String()), "pullwise_metadata_write_seconds"); err != nil {
		t.Error(err)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	for _, want := range []string{"image=holder turn=0s write=1s", "image=waiter turn=1s write=0s"} {
		if !slices.ContainsFunc(lines, func(l string) bool {
			return strings.Contains(l, `msg="metadata write was slow"`) && strings.Contains(l, want)
		}) {
			t.Errorf("no slow write line with %q in\n%s", want, logged.String())
		}
	}
}

// TestLockHolderWritesMoveUp: a pull holding the lock on a blob or layer
// (lane.KeyedLock, the unpacker's duplication suppressor) that an earlier
// pull waits on commits it in a write turn; that write goes before a
// pull due between the two, or the waiter waits behind that pull's
// writes.
func TestLockHolderWritesMoveUp(t *testing.T) {
	turns := New()
	line := lendtest.ImageWrites(func(s images.Store) images.Store { return Images{Store: s, Turns: turns} }, turns)
	lendtest.HolderGoesFirst(t, lane.NewKeyedLock(turns), line, false)
}
