package early

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/internal/contenttest"
)

// blob is a layer of size random bytes.
func blob(t *testing.T, size int) ([]byte, ocispec.Descriptor) {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	return b, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: digest.FromBytes(b), Size: int64(size)}
}

// pipeFetcher serves one blob through a pipe the test writes.
type pipeFetcher struct {
	r *io.PipeReader
}

func (f pipeFetcher) Fetch(context.Context, ocispec.Descriptor) (io.ReadCloser, error) {
	return f.r, nil
}

// readingApplier reads the layer's blob through Provider as
// transfer/implied does, and says when it has read its first bytes.
type readingApplier struct {
	content   content.Provider
	firstRead chan []byte
}

func (a readingApplier) Apply(ctx context.Context, desc ocispec.Descriptor, _ []mount.Mount, _ ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	ra, err := a.content.ReaderAt(ctx, desc)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer ra.Close()
	r := content.NewReader(ra)
	first := make([]byte, 1<<10)
	if _, err := io.ReadFull(r, first); err != nil {
		return ocispec.Descriptor{}, err
	}
	a.firstRead <- first
	rest, err := io.ReadAll(r)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return ocispec.Descriptor{Digest: digest.FromBytes(append(first, rest...)), Size: int64(len(first) + len(rest))}, nil
}

// events records a pull's progress events.
type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) add(p transfer.Progress) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, p.Event)
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

func withMinSize(t *testing.T, size int64) {
	prev := MinSize
	MinSize = size
	t.Cleanup(func() { MinSize = prev })
}

func TestLayerIsWrittenWhileItArrives(t *testing.T) {
	withMinSize(t, 1)
	data, desc := blob(t, 4<<20) // content.Copy writes in MiB
	cs := contenttest.NewStore(t)
	n := &Node{Content: cs, Dir: t.TempDir()}
	pr, pw := io.Pipe()
	var ev events
	ctx, p := n.Start(context.Background(), "registry.test/app:1", func(context.Context) (remotes.Fetcher, error) {
		return pipeFetcher{r: pr}, nil
	}, ev.add)

	if _, err := n.Handler(ctx, desc); !errors.Is(err, images.ErrStopHandler) {
		t.Fatalf("handler: %v, want containerd's fetch stopped", err)
	}
	ra := readingApplier{content: Provider{Provider: cs}, firstRead: make(chan []byte, 1)}
	a := Applier{Applier: ra, Node: n, Reads: func([]mount.Mount) bool { return true }}
	type result struct {
		desc ocispec.Descriptor
		err  error
	}
	applied := make(chan result, 1)
	go func() {
		d, err := a.Apply(ctx, desc, nil)
		applied <- result{d, err}
	}()

	half := len(data) / 2
	if _, err := pw.Write(data[:half]); err != nil {
		t.Fatal(err)
	}
	// The apply reads the first bytes while the rest is still to come.
	if first := <-ra.firstRead; !bytes.Equal(first, data[:len(first)]) {
		t.Fatal("the apply read other bytes than the blob's first")
	}
	if _, err := cs.Info(ctx, desc.Digest); !errdefs.IsNotFound(err) {
		t.Fatalf("blob in the store before its last byte: %v", err)
	}
	if _, err := pw.Write(data[half:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	res := <-applied
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.desc.Digest != desc.Digest {
		t.Fatal("the apply read other bytes than the blob's")
	}
	// Apply returns once the blob is committed, digest checked.
	info, err := cs.Info(ctx, desc.Digest)
	if err != nil {
		t.Fatalf("blob not in the store after its layer was applied: %v", err)
	}
	if info.Labels["containerd.io/distribution.source.registry.test"] != "app" {
		t.Errorf("labels %v, want the distribution source", info.Labels)
	}
	p.End(false)
	if got := ev.list(); len(got) != 2 || got[0] != "waiting" || got[1] != "complete" {
		t.Errorf("events %v, want waiting then complete", got)
	}
}

func TestFailedDownloadFailsItsApply(t *testing.T) {
	withMinSize(t, 1)
	data, desc := blob(t, 64<<10)
	cases := []struct {
		name string
		feed func(w *io.PipeWriter)
	}{
		{"cut short", func(w *io.PipeWriter) {
			w.Write(data[:len(data)/2])
			w.CloseWithError(errors.New("connection reset"))
		}},
		{"wrong bytes", func(w *io.PipeWriter) {
			bad := bytes.Clone(data)
			bad[len(bad)-1] ^= 1
			w.Write(bad)
			w.Close()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := contenttest.NewStore(t)
			n := &Node{Content: cs, Dir: t.TempDir()}
			pr, pw := io.Pipe()
			ctx, p := n.Start(context.Background(), "registry.test/app:1", func(context.Context) (remotes.Fetcher, error) {
				return pipeFetcher{r: pr}, nil
			}, nil)
			if _, err := n.Handler(ctx, desc); !errors.Is(err, images.ErrStopHandler) {
				t.Fatalf("handler: %v", err)
			}
			go tc.feed(pw)
			ra := readingApplier{content: Provider{Provider: cs}, firstRead: make(chan []byte, 1)}
			a := Applier{Applier: ra, Node: n, Reads: func([]mount.Mount) bool { return true }}
			if _, err := a.Apply(ctx, desc, nil); err == nil {
				t.Fatal("applied a layer whose download failed")
			}
			p.End(true)
			if _, err := cs.Info(ctx, desc.Digest); !errdefs.IsNotFound(err) {
				t.Fatalf("blob in the store: %v", err)
			}
			if n.arriving(desc.Digest) != nil {
				t.Fatal("the failed download is still arriving for other pulls")
			}
		})
	}
}

// A layer applied where the applier reads the store itself waits for its
// blob; one already in the store, or below MinSize, is left to containerd.
func TestHandlerLeavesToContainerd(t *testing.T) {
	withMinSize(t, 1<<10)
	_, smallDesc := blob(t, 512)
	present, presentDesc := blob(t, 4<<10)
	cs := contenttest.NewStore(t)
	if err := content.WriteBlob(context.Background(), cs, "present", bytes.NewReader(present), presentDesc); err != nil {
		t.Fatal(err)
	}
	n := &Node{Content: cs, Dir: t.TempDir()}
	ctx, p := n.Start(context.Background(), "registry.test/app:1", func(context.Context) (remotes.Fetcher, error) {
		return nil, errors.New("nothing may be fetched here")
	}, nil)
	defer p.End(false)
	manifest := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromString("m"), Size: 1 << 20}
	for _, d := range []ocispec.Descriptor{smallDesc, presentDesc, manifest} {
		if _, err := n.Handler(ctx, d); err != nil {
			t.Errorf("%s: %v, want containerd's handlers to go on", d.MediaType, err)
		}
	}
	// A pull without Start leaves every blob to containerd.
	_, bigDesc := blob(t, 8<<10)
	if _, err := n.Handler(context.Background(), bigDesc); err != nil {
		t.Errorf("pull without Start: %v", err)
	}
}

func TestReadyWhenWhatArrivedTakesAsLongAsTheRest(t *testing.T) {
	_, desc := blob(t, 1<<10)
	cases := []struct {
		name   string
		cost   func(string, int64) time.Duration
		ended  bool
		stream bool
	}{
		{"writing is slow: starts at the first bytes", func(string, int64) time.Duration { return time.Hour }, false, true},
		{"writing is free: waits for the last byte, then reads the store", func(string, int64) time.Duration { return 0 }, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := newArrival(t.TempDir(), desc, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer a.close()
			a.add(make([]byte, 100))
			if tc.ended {
				go a.end(nil)
			}
			stream, err := a.ready(context.Background(), tc.cost)
			if err != nil || stream != tc.stream {
				t.Fatalf("ready: %v %v, want %v", stream, err, tc.stream)
			}
		})
	}
}

// A spool that stops (a resumed ingest, a full disk) leaves the rest of
// the blob to the store, once committed.
func TestReaderTakesTheRestFromTheStore(t *testing.T) {
	data, desc := blob(t, 64<<10)
	cs := contenttest.NewStore(t)
	a, err := newArrival(t.TempDir(), desc, cs)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	a.add(data[:1000])
	a.spoil()
	a.add(data[1000:2000]) // not spooled
	done := make(chan []byte, 1)
	go func() {
		b, err := io.ReadAll(content.NewReader(&reader{a: a, ctx: context.Background()}))
		if err != nil {
			t.Error(err)
		}
		done <- b
	}()
	if err := content.WriteBlob(context.Background(), cs, "blob", bytes.NewReader(data), desc); err != nil {
		t.Fatal(err)
	}
	a.end(nil)
	if got := <-done; !bytes.Equal(got, data) {
		t.Fatalf("read %d bytes, not the blob", len(got))
	}
}

// TestWriteGivesWayToPullsAhead: the layer's write does not start while
// Node.Yield says pulls due before its own are in flight. (Once started,
// the lane's Pacer has it give way: lane's TestPacerWrittenEarly.)
func TestWriteGivesWayToPullsAhead(t *testing.T) {
	withMinSize(t, 1)
	data, desc := blob(t, 4<<20)
	cs := contenttest.NewStore(t)
	var ahead atomic.Bool
	ahead.Store(true)
	var yields atomic.Int64
	n := &Node{Content: cs, Dir: t.TempDir(), Yield: func(ctx context.Context) error {
		yields.Add(1)
		for ahead.Load() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		return nil
	}}
	pr, pw := io.Pipe()
	ctx, p := n.Start(context.Background(), "registry.test/app:1", func(context.Context) (remotes.Fetcher, error) {
		return pipeFetcher{r: pr}, nil
	}, nil)
	defer p.End(false)
	if _, err := n.Handler(ctx, desc); !errors.Is(err, images.ErrStopHandler) {
		t.Fatalf("handler: %v", err)
	}
	go func() {
		pw.Write(data)
		pw.Close()
	}()
	ra := readingApplier{content: Provider{Provider: cs}, firstRead: make(chan []byte, 1)}
	a := Applier{Applier: ra, Node: n, Reads: func([]mount.Mount) bool { return true }}
	applied := make(chan error, 1)
	go func() {
		_, err := a.Apply(ctx, desc, nil)
		applied <- err
	}()
	await.Until(t, 10*time.Second, "the apply to ask whether pulls are ahead", func() bool { return yields.Load() > 0 })
	select {
	case <-ra.firstRead:
		t.Fatal("the layer was read while pulls ahead were in flight")
	case <-time.After(50 * time.Millisecond):
	}
	ahead.Store(false)
	<-ra.firstRead
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
}
