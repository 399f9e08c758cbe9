// Package space keeps image pulls within the node's disk. A pull writes its
// compressed blobs into the content store and their files into a
// snapshotter; on a nearly full disk, pulls started together all fail
// half-way with ENOSPC, and none finishes. The Ledger admits a pull only
// when what it will write, and what the pulls admitted before it will
// still write, fits on each filesystem beyond a reserve kept for the node.
// A pull that does not fit waits; one that could never fit fails at once.
package space

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/errdefs"
	"github.com/docker/go-units"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Usage is what statfs says of a filesystem.
type Usage struct {
	Free  uint64 // bytes available to containerd
	Total uint64
	// Dev identifies the filesystem: the content store and a snapshotter
	// on one filesystem share its space.
	Dev uint64
}

// Need is what one pull will write.
type Need struct {
	// Layers are the compressed blobs the pull will fetch: not in the
	// content store, and not below a snapshot already on the node.
	Layers []ocispec.Descriptor
	// Snapshotter is what the layers unpack into.
	Snapshotter string
}

// Config places the filesystems pulls write to.
type Config struct {
	// Content is the content store's root directory.
	Content string
	// Snapshotters are the snapshotters' root directories, by name. Pulls
	// into a snapshotter missing here (a remote one, say) are not checked.
	Snapshotters map[string]string
	// ReservePercent of each filesystem's size is left free for the node.
	ReservePercent int
	// Timeout bounds the wait for space (pull_queue_timeout); 0 leaves it
	// to the caller's context.
	Timeout time.Duration
	// Stat reads a filesystem's usage (Statfs in production).
	Stat func(path string) (Usage, error)
	// Present reports whether a blob is committed in the content store:
	// its bytes are then on the disk, counted in Free.
	Present func(digest.Digest) bool
	// Poll is how often a waiting pull looks again for space freed
	// outside the ledger (kubelet's image GC, a removed image); 0 is
	// DefaultPoll.
	Poll time.Duration
	// Observe, when set, learns the free space of each filesystem at
	// every check: "content" for the content store's, a snapshotter's
	// name for its own.
	Observe func(filesystem string, free uint64)
}

// DefaultPoll is how often a pull waiting for space looks again. Space
// freed by an admitted pull's end wakes it at once; space freed by image
// removal and GC has no event here, and a second is short beside a pull.
const DefaultPoll = time.Second

// Ledger admits pulls by disk space. The zero value is not usable: call
// New.
type Ledger struct {
	c     Config
	ratio *Ratio

	mu       sync.Mutex
	admitted map[*admission]struct{}
	changed  chan struct{} // closed when an admission ends
}

type admission struct{ need Need }

// New returns a Ledger for c; ratio estimates the unpacked size of a
// compressed byte.
func New(c Config, ratio *Ratio) *Ledger {
	if c.Poll <= 0 {
		c.Poll = DefaultPoll
	}
	return &Ledger{c: c, ratio: ratio, admitted: map[*admission]struct{}{}, changed: make(chan struct{})}
}

// Admit returns once n fits beside the pulls admitted before it, with the
// release func that ends its admission: call it once the pull is over.
// waiting is called once, when the pull has to wait. A pull that could not
// fit even on its filesystems emptied but for the reserve fails at once,
// and one that waits past the timeout fails; both with a *FullError,
// which wraps errdefs.ErrResourceExhausted.
//
// A pull into a snapshotter the ledger does not know (a remote one, whose
// layers may never be fetched) is admitted as it comes.
func (l *Ledger) Admit(ctx context.Context, n Need, waiting func()) (release func(), err error) {
	if _, ok := l.c.Snapshotters[n.Snapshotter]; !ok {
		return func() {}, nil
	}
	var expired <-chan time.Time
	if l.c.Timeout > 0 {
		t := time.NewTimer(l.c.Timeout)
		defer t.Stop()
		expired = t.C
	}
	poll := time.NewTicker(l.c.Poll)
	defer poll.Stop()
	told := false
	for {
		l.mu.Lock()
		changed := l.changed
		short, err := l.check(n)
		if err == nil && short == nil {
			a := &admission{need: n}
			l.admitted[a] = struct{}{}
			l.mu.Unlock()
			return l.releaseFunc(a), nil
		}
		l.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if short.never {
			return nil, short
		}
		if !told && waiting != nil {
			waiting()
			told = true
		}
		select {
		case <-changed:
		case <-poll.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-expired:
			short.waited = l.c.Timeout
			return nil, short
		}
	}
}

func (l *Ledger) releaseFunc(a *admission) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			delete(l.admitted, a)
			close(l.changed)
			l.changed = make(chan struct{})
		})
	}
}

// filesystem is one filesystem's side of a check.
type filesystem struct {
	names  []string // what is on it: "content store", "snapshotter overlayfs"
	path   string   // the first of them
	usage  Usage
	need   uint64 // what the candidate writes here
	others uint64 // what admitted pulls will still write here
	floor  uint64 // the candidate's own need at the least (unpacked as compressed)
}

// check returns the first filesystem n does not fit on now, or nil.
func (l *Ledger) check(n Need) (*FullError, error) {
	fss := map[uint64]*filesystem{}
	// name says what is on a filesystem, in messages; label, in metrics.
	on := func(name, label, path string) (*filesystem, error) {
		u, err := l.c.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("statfs %s (%s): %w", path, name, err)
		}
		if l.c.Observe != nil {
			l.c.Observe(label, u.Free)
		}
		f := fss[u.Dev]
		if f == nil {
			f = &filesystem{path: path, usage: u}
			fss[u.Dev] = f
		}
		if !slices.Contains(f.names, name) {
			f.names = append(f.names, name)
		}
		return f, nil
	}
	ratio := l.ratio.Value()
	others := make([]Need, 0, len(l.admitted))
	for a := range l.admitted {
		others = append(others, a.need)
	}

	// The content store: each blob not yet committed, once, whichever
	// pulls fetch it.
	content, err := on("content store", "content", l.c.Content)
	if err != nil {
		return nil, err
	}
	mine := blobs(n)
	theirs := map[digest.Digest]int64{}
	for _, o := range others {
		maps.Copy(theirs, blobs(o))
	}
	for d, size := range theirs {
		if l.c.Present == nil || !l.c.Present(d) {
			content.others += uint64(size)
		}
	}
	for d, size := range mine {
		content.floor += uint64(size)
		if _, shared := theirs[d]; !shared {
			content.need += uint64(size)
		}
	}

	// Each snapshotter: every layer unpacked once, estimated from its
	// compressed size, until the pull that unpacks it ends.
	perSnapshotter := map[string]map[digest.Digest]int64{}
	for _, o := range others {
		if perSnapshotter[o.Snapshotter] == nil {
			perSnapshotter[o.Snapshotter] = map[digest.Digest]int64{}
		}
		maps.Copy(perSnapshotter[o.Snapshotter], blobs(o))
	}
	for _, sn := range slices.Sorted(maps.Keys(perSnapshotter)) {
		root, ok := l.c.Snapshotters[sn]
		if !ok {
			continue
		}
		f, err := on("snapshotter "+sn, sn, root)
		if err != nil {
			return nil, err
		}
		for _, size := range perSnapshotter[sn] {
			f.others += uint64(float64(size) * ratio)
		}
	}
	if root, ok := l.c.Snapshotters[n.Snapshotter]; ok {
		f, err := on("snapshotter "+n.Snapshotter, n.Snapshotter, root)
		if err != nil {
			return nil, err
		}
		for d, size := range mine {
			f.floor += uint64(size)
			if _, shared := perSnapshotter[n.Snapshotter][d]; !shared {
				f.need += uint64(float64(size) * ratio)
			}
		}
	}

	for _, dev := range slices.Sorted(maps.Keys(fss)) {
		f := fss[dev]
		reserve := f.usage.Total / 100 * uint64(l.c.ReservePercent)
		short := &FullError{Filesystem: f.names, Path: f.path, Needed: f.need, Free: f.usage.Free, Reserved: reserve, Others: f.others}
		if f.floor+reserve > f.usage.Total {
			short.never = true
			return short, nil
		}
		if f.need+f.others+reserve > f.usage.Free {
			return short, nil
		}
	}
	return nil, nil
}

// blobs are n's layers by digest.
func blobs(n Need) map[digest.Digest]int64 {
	out := make(map[digest.Digest]int64, len(n.Layers))
	for _, l := range n.Layers {
		out[l.Digest] = l.Size
	}
	return out
}

// FullError is a pull the disk has no room for.
type FullError struct {
	// Filesystem names what is on the filesystem: "content store",
	// "snapshotter overlayfs".
	Filesystem []string
	Path       string
	// Needed is what the pull would write there, Free what statfs saw,
	// Reserved what is kept for the node, Others what pulls admitted
	// before it will still write.
	Needed, Free, Reserved, Others uint64
	never                          bool          // the filesystem could never hold it
	waited                         time.Duration // how long it waited for room
	ran                            bool          // it ran out of room while writing
}

func (e *FullError) Error() string {
	var why string
	switch {
	case e.ran:
		why = "the filesystem filled up during the pull"
	case e.never:
		why = "more than it can ever hold"
	case e.waited > 0:
		why = fmt.Sprintf("no room for it within %s (pull_queue_timeout)", e.waited)
	default:
		why = "no room for it"
	}
	msg := fmt.Sprintf("not enough disk space for the pull: the filesystem of the %s (%s) has %s free; the pull needs %s",
		joinNames(e.Filesystem), e.Path, units.BytesSize(float64(e.Free)), units.BytesSize(float64(e.Needed)))
	if e.Others > 0 {
		msg += fmt.Sprintf(", pulls under way %s more", units.BytesSize(float64(e.Others)))
	}
	if e.Reserved > 0 {
		msg += fmt.Sprintf(", and %s is kept free for the node (disk_reserve_percent)", units.BytesSize(float64(e.Reserved)))
	}
	return msg + ": " + why
}

// Unwrap makes the error a ResourceExhausted one for gRPC.
func (e *FullError) Unwrap() error { return errdefs.ErrResourceExhausted }

func joinNames(names []string) string {
	switch len(names) {
	case 0:
		return "containerd root"
	case 1:
		return names[0]
	}
	return fmt.Sprintf("%s and the %s", names[0], names[1])
}

// Explain turns a pull that failed for lack of space (ENOSPC: a pull the
// ledger admitted on an estimate, or space taken outside it) into a
// FullError naming the filesystem its write failed on, said once however
// many of its writers failed; nil for any other error.
func (l *Ledger) Explain(err error, n Need) *FullError {
	if err == nil || (!errors.Is(err, syscall.ENOSPC) && !strings.Contains(err.Error(), syscall.ENOSPC.Error())) {
		return nil
	}
	name, path, needed := "content store", l.c.Content, uint64(bytesOf(n.Layers))
	var pe *fs.PathError
	if errors.As(err, &pe) {
		for _, sn := range slices.Sorted(maps.Keys(l.c.Snapshotters)) {
			if root := l.c.Snapshotters[sn]; Within(pe.Path, root) {
				name, path = "snapshotter "+sn, root
				needed = uint64(float64(needed) * l.ratio.Value())
			}
		}
	}
	e := &FullError{Filesystem: []string{name}, Path: path, Needed: needed, ran: true}
	if u, serr := l.c.Stat(path); serr == nil {
		e.Free = u.Free
	}
	return e
}

// Within reports whether path is root or below it.
func Within(path, root string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

func bytesOf(blobs []ocispec.Descriptor) int64 {
	var n int64
	for _, b := range blobs {
		n += b.Size
	}
	return n
}
