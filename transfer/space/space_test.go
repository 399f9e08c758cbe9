package space

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

const MiB = 1 << 20

func layer(name string, size int64) ocispec.Descriptor {
	return ocispec.Descriptor{Digest: digest.FromString(name), Size: size}
}

// disk is a fake pair of filesystems: /content and /snap, one device or
// two.
type disk struct {
	mu      sync.Mutex
	free    map[string]uint64
	total   uint64
	shared  bool
	present map[digest.Digest]bool
}

func (d *disk) stat(path string) (Usage, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dev := uint64(1)
	if !d.shared && strings.HasPrefix(path, "/snap") {
		dev = 2
	}
	key := path
	if d.shared {
		key = "/content"
	}
	return Usage{Free: d.free[key], Total: d.total, Dev: dev}, nil
}

func (d *disk) setFree(path string, free uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.free[path] = free
}

func ledger(d *disk, reserve int, timeout time.Duration) *Ledger {
	r := &Ratio{}
	r.Observe(100, 150) // unpacked, a layer takes 1.5 times its blob
	return New(Config{
		Content:        "/content",
		Snapshotters:   map[string]string{"overlayfs": "/snap"},
		ReservePercent: reserve,
		Timeout:        timeout,
		Stat:           d.stat,
		Present:        func(dg digest.Digest) bool { return d.present[dg] },
		Poll:           time.Hour, // only releases wake waiters here
	}, r)
}

// TestAdmission: a pull fits when what it writes, and what the pulls
// admitted before it still write, stays within each filesystem's free
// space less the reserve; a layer shared with an admitted pull counts
// once.
func TestAdmission(t *testing.T) {
	a, b, c := layer("a", 40*MiB), layer("b", 40*MiB), layer("c", 20*MiB)
	for _, tc := range []struct {
		name     string
		shared   bool // content and snapshots on one filesystem
		free     uint64
		admitted []ocispec.Descriptor // layers of a pull admitted first
		present  []ocispec.Descriptor // committed in the content store
		pull     []ocispec.Descriptor
		fits     bool
		never    bool
	}{
		// Alone, two filesystems: 80 MiB of blobs, 120 MiB of files, and
		// the reserve, 10% of 200 MiB.
		{name: "fits alone", free: 145 * MiB, pull: []ocispec.Descriptor{a, b}, fits: true},
		{name: "files do not fit", free: 130 * MiB, pull: []ocispec.Descriptor{a, b}},
		// One filesystem: 80 + 120 + 20 = 220 MiB.
		{name: "one filesystem, fits", shared: true, free: 225 * MiB, pull: []ocispec.Descriptor{a, b}, fits: true},
		{name: "one filesystem, does not", shared: true, free: 210 * MiB, pull: []ocispec.Descriptor{a, b}},
		// A pull admitted first, of c (20 MiB of blobs and 30 of files
		// still to come) or of a.
		{name: "beside another pull", free: 145 * MiB, admitted: []ocispec.Descriptor{c}, pull: []ocispec.Descriptor{a, b}},
		{name: "sharing a layer with it", free: 145 * MiB, admitted: []ocispec.Descriptor{a}, pull: []ocispec.Descriptor{a, b}, fits: true},
		{name: "its blob already in", free: 130 * MiB, admitted: []ocispec.Descriptor{c}, present: []ocispec.Descriptor{c}, pull: []ocispec.Descriptor{b}, fits: true},
		{name: "into the reserve", free: 70 * MiB, pull: []ocispec.Descriptor{a}},
		{name: "beside the reserve", free: 81 * MiB, pull: []ocispec.Descriptor{a}, fits: true},
		{name: "larger than the disk", free: 500 * MiB, pull: []ocispec.Descriptor{layer("huge", 190*MiB)}, never: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &disk{free: map[string]uint64{"/content": tc.free, "/snap": tc.free}, total: 200 * MiB, shared: tc.shared, present: map[digest.Digest]bool{}}
			for _, p := range tc.present {
				d.present[p.Digest] = true
			}
			l := ledger(d, 10, 0)
			if tc.admitted != nil {
				l.admitted[&admission{need: Need{Layers: tc.admitted, Snapshotter: "overlayfs"}}] = struct{}{}
			}
			short, err := l.check(Need{Layers: tc.pull, Snapshotter: "overlayfs"})
			if err != nil {
				t.Fatal(err)
			}
			if fits := short == nil; fits != tc.fits {
				t.Fatalf("fits = %t, want %t (%v)", fits, tc.fits, short)
			}
			if short != nil && short.never != tc.never {
				t.Fatalf("never = %t, want %t: %v", short.never, tc.never, short)
			}
		})
	}
}

// A pull that does not fit waits without a slot, is said to wait, and
// goes once an admitted pull ends and its writes are on the disk; one
// that waits past the timeout fails with ResourceExhausted naming the
// filesystem.
func TestAdmitWaits(t *testing.T) {
	d := &disk{free: map[string]uint64{"/content": 100 * MiB, "/snap": 100 * MiB}, total: 1000 * MiB, present: map[digest.Digest]bool{}}
	l := ledger(d, 0, 0)
	ctx := context.Background()
	first, err := l.Admit(ctx, Need{Layers: []ocispec.Descriptor{layer("a", 50*MiB)}, Snapshotter: "overlayfs"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	admitted := make(chan error, 1)
	go func() {
		release, err := l.Admit(ctx, Need{Layers: []ocispec.Descriptor{layer("b", 50*MiB)}, Snapshotter: "overlayfs"}, func() { close(waiting) })
		if err == nil {
			release()
		}
		admitted <- err
	}()
	<-waiting
	// The first pull wrote its 50 MiB blob and 75 MiB of files.
	d.setFree("/content", 50*MiB)
	d.setFree("/snap", 25*MiB)
	first()
	select {
	case err := <-admitted:
		t.Fatalf("admitted (%v) with 25 MiB free for 75 MiB of files", err)
	default:
	}
	// Image GC frees space; the next check sees it.
	d.setFree("/snap", 200*MiB)
	l.mu.Lock()
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	if err := <-admitted; err != nil {
		t.Fatalf("not admitted once there was room: %v", err)
	}

	short := ledger(d, 0, 10*time.Millisecond)
	d.setFree("/snap", 10*MiB)
	_, err = short.Admit(ctx, Need{Layers: []ocispec.Descriptor{layer("c", 50*MiB)}, Snapshotter: "overlayfs"}, nil)
	var full *FullError
	if !errors.As(err, &full) || !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "snapshotter overlayfs (/snap)") {
		t.Fatalf("Admit past the timeout: %v, want ResourceExhausted naming the snapshotter's filesystem", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := ledger(d, 0, 0).Admit(cctx, Need{Layers: []ocispec.Descriptor{layer("c", 50*MiB)}, Snapshotter: "overlayfs"}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit with its context gone: %v", err)
	}
	// A snapshotter the ledger does not know (a remote one) is not held.
	release, err := ledger(d, 0, 0).Admit(ctx, Need{Layers: []ocispec.Descriptor{layer("c", 900*MiB)}, Snapshotter: "stargz"}, nil)
	if err != nil {
		t.Fatalf("a remote snapshotter's pull held back: %v", err)
	}
	release()
}

// ENOSPC from any writer of a pull, however wrapped or joined, is one
// FullError naming the filesystem the write failed on.
func TestExplain(t *testing.T) {
	d := &disk{free: map[string]uint64{"/content": 3 * MiB, "/snap": 1 * MiB}, total: 200 * MiB}
	l := ledger(d, 0, 0)
	need := Need{Layers: []ocispec.Descriptor{layer("a", 40*MiB)}, Snapshotter: "overlayfs"}
	ingest := fmt.Errorf("failed to copy: %w", &fs.PathError{Op: "write", Path: "/content/ingest/x/data", Err: syscall.ENOSPC})
	files := fmt.Errorf("apply layer: %w", &fs.PathError{Op: "write", Path: "/snap/snapshots/7/fs/f", Err: syscall.ENOSPC})
	for _, tc := range []struct {
		name string
		err  error
		want string // "" for nil
	}{
		{name: "ingest", err: ingest, want: "content store (/content) has 3MiB free; the pull needs 40MiB"},
		{name: "doubled", err: errors.Join(ingest, ingest), want: "content store (/content)"},
		{name: "unpack", err: files, want: "snapshotter overlayfs (/snap) has 1MiB free; the pull needs 60MiB"},
		{name: "said only in words", err: errors.New("failed to pull: write /x: no space left on device"), want: "content store"},
		{name: "another error", err: errors.New("manifest unknown")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := l.Explain(tc.err, need)
			if tc.want == "" {
				if got != nil {
					t.Fatalf("Explain = %v, want nil", got)
				}
				return
			}
			if got == nil || !strings.Contains(got.Error(), tc.want) || !errdefs.IsResourceExhausted(got) {
				t.Fatalf("Explain = %v, want ResourceExhausted saying %q", got, tc.want)
			}
			if strings.Count(got.Error(), "no space left") > 0 || strings.Contains(got.Error(), "\n") {
				t.Fatalf("Explain repeats the raw errors: %q", got)
			}
		})
	}
}

func TestRatio(t *testing.T) {
	var r Ratio
	if r.Value() != DefaultRatio {
		t.Fatalf("unlearned ratio %v, want %v", r.Value(), DefaultRatio)
	}
	r.Observe(10, 30)
	r.Observe(10, 10)
	if r.Value() != 2 {
		t.Fatalf("ratio %v after 20 bytes becoming 40, want 2", r.Value())
	}
	r.Observe(0, 5) // nothing to learn from
	if r.Value() != 2 {
		t.Fatalf("ratio %v, moved by an empty layer", r.Value())
	}
}
