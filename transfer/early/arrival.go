package early

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// arrival is a blob's bytes as its download writes them, in a spool file
// of their own, for the layer's apply to read as they come.
//
// The content store's ingest holds the same bytes, but containerd reads
// nothing from an ingest before it is committed, and peers' spool
// (transfer/peers) is kept for other nodes, with its own life; this one
// lives only as long as the pull.
type arrival struct {
	desc  ocispec.Descriptor
	f     *os.File
	store content.Provider // read once the blob is committed
	// cancel ends the download; set before it starts.
	cancel context.CancelFunc

	mu    sync.Mutex
	have  int64     // bytes in f, from 0
	first time.Time // when the first of them came
	// spoiled: no more bytes are spooled (the download resumed an
	// earlier ingest, or the spool could not be written); readers take
	// the rest from the store once the blob is committed.
	spoiled bool
	ended   bool
	err     error         // the download's, once ended
	grew    chan struct{} // closed when have grows or the download ends; nil: nobody waits
	closed  bool

	// readers' waits for bytes not yet here, ns; added to at every read,
	// so atomic rather than under mu.
	starved atomic.Int64
}

func newArrival(dir string, desc ocispec.Descriptor, store content.Provider) (*arrival, error) {
	f, err := os.CreateTemp(dir, "early-")
	if err != nil {
		return nil, err
	}
	// Gone from the directory at once: a crash leaves nothing behind.
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, err
	}
	return &arrival{desc: desc, f: f, store: store}, nil
}

// add spools p, the bytes after those spooled, as the download writes them.
func (a *arrival) add(p []byte) {
	a.mu.Lock()
	spoiled := a.spoiled
	a.mu.Unlock()
	if spoiled || len(p) == 0 {
		return
	}
	// Only the download writes; readers read below have.
	_, err := a.f.Write(p)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.spoiled = true
	} else {
		if a.have == 0 {
			a.first = time.Now()
		}
		a.have += int64(len(p))
	}
	a.signal()
}

// spoil stops the spooling: the download resumed, or restarted, where
// the spool does not follow.
func (a *arrival) spoil() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.spoiled = true
	a.signal()
}

// end records the download's outcome.
func (a *arrival) end(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ended, a.err = true, err
	a.signal()
}

func (a *arrival) signal() {
	if a.grew != nil {
		close(a.grew)
		a.grew = nil
	}
}

// changed returns a channel closed at the next change. Call with a.mu held.
func (a *arrival) changed() chan struct{} {
	if a.grew == nil {
		a.grew = make(chan struct{})
	}
	return a.grew
}

// until waits until cond, called with a.mu held, holds, or ctx ends; it
// returns how long it waited. A cond that holds at once costs one lock
// and no clock reading: a reader calls it at every read.
func (a *arrival) until(ctx context.Context, cond func() bool) (time.Duration, error) {
	var start time.Time
	waited := func() time.Duration {
		if start.IsZero() {
			return 0
		}
		return time.Since(start)
	}
	for {
		a.mu.Lock()
		if cond() {
			a.mu.Unlock()
			return waited(), nil
		}
		ch := a.changed()
		a.mu.Unlock()
		if start.IsZero() {
			start = time.Now()
		}
		select {
		case <-ctx.Done():
			return waited(), ctx.Err()
		case <-ch:
		}
	}
}

// wait waits for the download to end, and returns its error.
func (a *arrival) wait(ctx context.Context) error {
	var derr error
	if _, err := a.until(ctx, func() bool { derr = a.err; return a.ended }); err != nil {
		return err
	}
	return derr
}

// ready waits until the layer should start being written: once what has
// arrived would take as long to write as the rest takes to arrive, at
// the pace it has come so far, by cost. It reports false when the
// download ended first, or no longer spools: the layer is then written
// from the store, as containerd would.
func (a *arrival) ready(ctx context.Context, cost func(mediaType string, size int64) time.Duration) (bool, error) {
	paced := func() bool {
		return a.have > 0 && (cost == nil || cost(a.desc.MediaType, a.have) >= a.rest(time.Now()))
	}
	// The state as cond found it under a.mu.
	var ended, spoiled bool
	var derr error
	if _, err := a.until(ctx, func() bool {
		ended, spoiled, derr = a.ended, a.spoiled, a.err
		return ended || spoiled || paced()
	}); err != nil {
		return false, err
	}
	switch {
	case ended:
		return false, derr
	case spoiled:
		return false, a.wait(ctx)
	}
	return true, nil
}

// rest is how long the bytes not here yet take to arrive, at the pace of
// those that have. Call with a.mu held and a.have > 0.
func (a *arrival) rest(now time.Time) time.Duration {
	took := now.Sub(a.first)
	return time.Duration(float64(took) * float64(a.desc.Size-a.have) / float64(a.have))
}

// Starved is how long readers have waited for bytes still on their way.
func (a *arrival) Starved() time.Duration { return time.Duration(a.starved.Load()) }

func (a *arrival) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		a.closed = true
		a.f.Close()
	}
}

// reader reads the blob as it arrives. The download's end, cancelled or
// not, wakes every read, as does the end of the apply's context.
type reader struct {
	a     *arrival
	ctx   context.Context  // the apply's, for the store
	store content.ReaderAt // once the blob is committed and the spool falls short
}

func (r *reader) Size() int64 { return r.a.desc.Size }

func (r *reader) Close() error {
	if r.store != nil {
		return r.store.Close()
	}
	return nil
}

// ReadAt waits for the bytes at off, reads them from the spool, and from
// the store those the spool does not have once the blob is committed.
func (r *reader) ReadAt(p []byte, off int64) (int, error) {
	a := r.a
	end := min(off+int64(len(p)), a.desc.Size)
	// What the read needs, as cond found it under a.mu.
	var have int64
	var derr error
	waited, err := a.until(r.ctx, func() bool {
		have, derr = a.have, a.err
		return end <= have || a.ended
	})
	a.starved.Add(int64(waited))
	switch {
	case err != nil:
		return 0, err
	case end <= have:
		return a.f.ReadAt(p, off)
	case derr != nil:
		return 0, fmt.Errorf("download of %s: %w", a.desc.Digest, derr)
	}
	return r.fromStore(p, off)
}

func (r *reader) fromStore(p []byte, off int64) (int, error) {
	if r.store == nil {
		ra, err := r.a.store.ReaderAt(r.ctx, r.a.desc)
		if err != nil {
			return 0, fmt.Errorf("read %s from the content store: %w", r.a.desc.Digest, err)
		}
		r.store = ra
	}
	return r.store.ReadAt(p, off)
}
