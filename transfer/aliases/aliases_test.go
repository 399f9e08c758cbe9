package aliases

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/core/events/exchange"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/metadata/boltutil"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"

	eventstypes "github.com/containerd/containerd/api/events"

	"github.com/pullwise/pullwise/internal/metadatatest"
)

const (
	tag = "registry.test/app:v1"
	id  = "sha256:0123456789012345678901234567890123456789012345678901234567890123"
	dig = "registry.test/app@sha256:abcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcd"
)

func target(s string) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString(s), Size: 1}
}

// TestStoreWritesAliasesWithTheRecord: what a caller names ends up as
// records of the same image, written in the record's own transaction; a
// name that exists is left as it was, and whatever goes wrong with an
// alias, the record itself is stored.
func TestStoreWritesAliasesWithTheRecord(t *testing.T) {
	labels := map[string]string{"io.cri-containerd.image": "managed", "io.pullwise.pull-source": "mirror.test/app:v1"}
	for _, tc := range []struct {
		name      string
		before    []images.Image // records there before the write
		names     Names          // nil: none in the context
		write     func(ctx context.Context, s images.Store) error
		callerTx  bool // write within a transaction of the caller's
		wantErr   error
		want      []string // records of target("new") with labels
		absent    []string
		writes    int64    // committed write transactions, the seeding's not counted
		events    []string // topic name, published after the write
		unchanged []images.Image
	}{
		{
			name:   "create with aliases",
			names:  names(id, dig),
			write:  create,
			want:   []string{tag, id, dig},
			writes: 1,
			events: []string{topicCreate + " " + tag, topicCreate + " " + id, topicCreate + " " + dig},
		},
		{
			name:      "an alias that exists is its owner's",
			before:    []images.Image{{Name: dig, Target: target("old"), Labels: map[string]string{"old": "1"}}},
			names:     names(id, dig),
			write:     create,
			want:      []string{tag, id},
			writes:    1,
			events:    []string{topicCreate + " " + tag, topicCreate + " " + id},
			unchanged: []images.Image{{Name: dig, Target: target("old"), Labels: map[string]string{"old": "1"}}},
		},
		{
			name:   "its own name and a repeat are not aliases",
			names:  names(tag, id, id, ""),
			write:  create,
			want:   []string{tag, id},
			writes: 1,
			events: []string{topicCreate + " " + tag, topicCreate + " " + id},
		},
		{
			name:   "names that fail give none",
			names:  func(context.Context, images.Image) ([]string, error) { return nil, errors.New("no config") },
			write:  create,
			want:   []string{tag},
			absent: []string{id},
			writes: 1,
			events: []string{topicCreate + " " + tag},
		},
		{
			name:   "an alias that cannot be written leaves the record alone",
			names:  names(id, unwritable),
			write:  create,
			want:   []string{tag},
			absent: []string{id},
			writes: 1,
			events: []string{topicCreate + " " + tag},
		},
		{
			name:   "outside a pull",
			write:  create,
			want:   []string{tag},
			absent: []string{id},
			writes: 1,
			events: []string{topicCreate + " " + tag},
		},
		{
			name:   "update whole",
			before: []images.Image{{Name: tag, Target: target("old")}},
			names:  names(id),
			write: func(ctx context.Context, s images.Store) error {
				_, err := s.Update(ctx, images.Image{Name: tag, Target: target("new"), Labels: maps.Clone(labels)})
				return err
			},
			want:   []string{tag, id},
			writes: 1,
			events: []string{topicUpdate + " " + tag, topicCreate + " " + id},
		},
		{
			name:   "update by field path",
			before: []images.Image{{Name: tag, Target: target("new"), Labels: maps.Clone(labels)}},
			names:  names(id),
			write: func(ctx context.Context, s images.Store) error {
				_, err := s.Update(ctx, images.Image{Name: tag, Labels: map[string]string{"x": "1"}}, "labels.x")
				return err
			},
			absent: []string{id},
			writes: 1,
			events: []string{topicUpdate + " " + tag},
		},
		{
			name:     "within the caller's transaction",
			names:    names(id, dig),
			write:    create,
			callerTx: true,
			want:     []string{tag},
			absent:   []string{id, dig},
			writes:   1,
		},
		{
			name:      "a create of a record that exists writes nothing",
			before:    []images.Image{{Name: tag, Target: target("old")}},
			names:     names(id),
			write:     create,
			wantErr:   errdefs.ErrAlreadyExists,
			absent:    []string{id},
			unchanged: []images.Image{{Name: tag, Target: target("old")}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := namespaces.WithNamespace(context.Background(), "test")
			ex := exchange.NewExchange()
			db := metadatatest.DB(t, metadata.WithEventsPublisher(ex))
			plain := metadata.NewImageStore(db)
			for _, img := range tc.before {
				if _, err := plain.Create(ctx, img); err != nil {
					t.Fatal(err)
				}
			}
			var writes atomic.Int64
			db.RegisterMutationCallback(func(bool) { writes.Add(1) })
			sctx, cancel := context.WithCancel(ctx)
			defer cancel()
			evs, _ := ex.Subscribe(sctx, `topic~="/images/"`)

			if tc.names != nil {
				ctx = With(ctx, tc.names)
			}
			s := Store{Store: failing{plain}, DB: db}
			var err error
			if tc.callerTx {
				done := make(chan error, 1)
				go func() {
					done <- db.Update(func(tx *bolt.Tx) error { return tc.write(boltutil.WithTransaction(ctx, tx), s) })
				}()
				select {
				case err = <-done:
				case <-time.After(10 * time.Second):
					// Not Fatal, nor a panic: either runs the test's
					// cleanups, and closing the database waits for the
					// stuck transaction for good.
					fmt.Fprintf(os.Stderr, "--- FAIL: %s: the write within the caller's transaction did not return: it waits for a transaction of its own\n", t.Name())
					os.Exit(1)
				}
			} else {
				err = tc.write(ctx, s)
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("write: %v, want %v", err, tc.wantErr)
			}
			if got := writes.Load(); got != tc.writes {
				t.Errorf("%d write transactions, want %d", got, tc.writes)
			}
			for _, n := range tc.want {
				got, err := plain.Get(ctx, n)
				if err != nil {
					t.Errorf("record %s: %v", n, err)
					continue
				}
				if got.Target.Digest != target("new").Digest || !maps.Equal(got.Labels, labels) {
					t.Errorf("record %s: target %s labels %v, want the image's (%s, %v)", n, got.Target.Digest, got.Labels, target("new").Digest, labels)
				}
			}
			for _, n := range tc.absent {
				if _, err := plain.Get(ctx, n); !errdefs.IsNotFound(err) {
					t.Errorf("record %s: %v, want it absent", n, err)
				}
			}
			for _, want := range tc.unchanged {
				got, err := plain.Get(ctx, want.Name)
				if err != nil || got.Target.Digest != want.Target.Digest || !maps.Equal(got.Labels, want.Labels) {
					t.Errorf("record %s: %+v (%v), want it as it was", want.Name, got, err)
				}
			}
			// An event of its own after the write ends the list: what the
			// write published comes before it, extra events included.
			if err := ex.Publish(ctx, "/images/delete", &eventstypes.ImageDelete{Name: endOfEvents}); err != nil {
				t.Fatal(err)
			}
			if got := receive(t, evs); !slices.Equal(got, tc.events) {
				t.Errorf("events %q, want %q", got, tc.events)
			}
		})
	}
}

// unwritable is a name the store fails to create.
const unwritable = "registry.test/unwritable"

// failing is the metadata store, but for the name it fails to create: the
// store's own failures (a full disk, a closed database) cannot be had on
// demand.
type failing struct{ images.Store }

func (f failing) Create(ctx context.Context, img images.Image) (images.Image, error) {
	if img.Name == unwritable {
		return images.Image{}, errors.New("disk full")
	}
	return f.Store.Create(ctx, img)
}

func names(n ...string) Names {
	return func(context.Context, images.Image) ([]string, error) { return n, nil }
}

func create(ctx context.Context, s images.Store) error {
	_, err := s.Create(ctx, images.Image{Name: tag, Target: target("new"), Labels: map[string]string{
		"io.cri-containerd.image": "managed", "io.pullwise.pull-source": "mirror.test/app:v1",
	}})
	return err
}

// endOfEvents names the image of the event that ends a case's events.
const endOfEvents = "end-of-events"

// receive returns the topics and image names of the events before the
// one named endOfEvents.
func receive(t *testing.T, evs <-chan *events.Envelope) []string {
	t.Helper()
	var out []string
	timeout := time.After(10 * time.Second)
	for {
		select {
		case env := <-evs:
			v, err := typeurl.UnmarshalAny(env.Event)
			if err != nil {
				t.Fatal(err)
			}
			name := ""
			switch e := v.(type) {
			case *eventstypes.ImageCreate:
				name = e.Name
			case *eventstypes.ImageUpdate:
				name = e.Name
			case *eventstypes.ImageDelete:
				if e.Name == endOfEvents {
					return out
				}
				name = e.Name
			}
			out = append(out, env.Topic+" "+name)
		case <-timeout:
			t.Fatalf("events so far %q, and not the end", out)
		}
	}
}
