// Package commits orders the writes a node's pulls make to containerd's
// metadata database by due (transfer/lane), earliest first.
//
// Every write to the database is a bolt transaction, and bolt runs one at
// a time, each ending with an fdatasync; a blob's commit also syncs the
// blob's file inside its transaction. A pull makes about thirty: opening
// and committing each blob, labelling it, preparing and committing each
// layer's snapshot, storing the image. In a burst of many small images,
// or of images of many layers, those transactions are what the pulls
// wait on most, and bolt's lock serves them in no order: the pull due
// first waits behind every other pull's writes, thirty times over
// (docs/pull-gate.md, "Metadata writes in due order", has the trace).
//
// The stores here take the one place of a lane before each write and
// give it back after, so the writes of the pull due first go first.
// Only the writes are ordered; reads (Info, Walk, Mounts, a View's own
// reads) run beside them as bolt lets them. Writes that do not pass
// through these stores (CRI's image records that a pull did not make
// with its own, CRI's create attempts, leases, garbage collection) still
// take bolt's lock as they come, between the ordered ones.
package commits

import (
	"context"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata/boltutil"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/transfer/lane"
)

// Turns hands out the turn to write, one at a time, in due order.
type Turns struct {
	lane *lane.Lane
	// seconds is how long writes waited for their turn ("turn") and then
	// took ("write": bolt's lock, which writes that are not a pull's share,
	// the transaction and its sync), so that an operator sees when pulls
	// wait on the database rather than on the link or the CPUs.
	seconds *prometheus.HistogramVec
	// turnSeconds and writeSeconds are its two series, looked up once
	// rather than on every write.
	turnSeconds, writeSeconds prometheus.Observer
	now                       func() time.Time // time.Now; tests set it
}

// New returns the node's write turns.
func New() *Turns {
	t := &Turns{
		lane: lane.New(1),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "pullwise",
			Name:      "metadata_write_seconds",
			Help:      "Pulls' writes to containerd's metadata database: the wait for their turn among the pulls' writes (phase=turn), and the write itself, with the wait for the database's one writer that other writes share (phase=write).",
			// A write is a transaction and an fdatasync, milliseconds on
			// an idle disk; in a burst they queue for seconds.
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10},
		}, []string{"phase"}),
		now: time.Now,
	}
	t.turnSeconds, t.writeSeconds = t.seconds.WithLabelValues("turn"), t.seconds.WithLabelValues("write")
	return t
}

// Describe implements prometheus.Collector.
func (t *Turns) Describe(ch chan<- *prometheus.Desc) { t.seconds.Describe(ch) }

// Collect implements prometheus.Collector.
func (t *Turns) Collect(ch chan<- prometheus.Metric) { t.seconds.Collect(ch) }

// do runs the write fn in its turn. A nil Turns runs it at once. The
// wait ignores ctx's end, as bolt's lock does: a write of a cancelled
// pull (an abort, a snapshot removed) still runs, and a write waits only
// for writes, each short.
//
// A write within the caller's own transaction runs at once: the caller
// holds bolt's lock already, and the holder of the turn may be waiting
// for it, so waiting for the turn would wait forever.
func (t *Turns) do(ctx context.Context, fn func() error) error {
	if t == nil {
		return fn()
	}
	if _, inTx := boltutil.Transaction(ctx); inTx {
		return fn()
	}
	asked := t.now()
	release, err := t.lane.Acquire(context.WithoutCancel(ctx))
	if err != nil {
		return err
	}
	defer release()
	turn := t.now()
	waited := turn.Sub(asked)
	t.turnSeconds.Observe(waited.Seconds())
	lane.TicketOf(ctx).Waited(lane.WaitWrite, waited)
	defer func() {
		wrote := t.now().Sub(turn)
		t.writeSeconds.Observe(wrote.Seconds())
		if waited+wrote >= slowWrite {
			log.G(ctx).WithFields(log.Fields{"turn": waited, "write": wrote}).Debug("metadata write was slow")
		}
	}()
	return fn()
}

// Waiting is how many writes wait for their turn, for tests.
func (t *Turns) Waiting() int { return t.lane.Waiting() }

// FirstOwner is the ticket of the first write in line, or nil, for tests.
func (t *Turns) FirstOwner() *lane.Ticket { return t.lane.FirstOwner() }

// Lend moves the writes of a pull waiting for their turn up to its Due
// (lane.KeyedLock): a pull holding the lock on a blob or layer that an
// earlier pull waits on commits it in a write turn, and that commit must
// not wait behind pulls due after the waiter. A nil Turns has no line.
func (t *Turns) Lend(tk *lane.Ticket) {
	if t != nil {
		t.lane.Lend(tk)
	}
}

// slowWrite is how long a pull's write may take, its turn and the write
// together, before a debug line names the pull: a write is milliseconds
// on an idle disk, so a second is a stall (the disk behind bolt's
// fdatasync, or bolt's lock held by writes outside the turns) that the
// histogram shows only summed over every pull.
const slowWrite = time.Second

// Content is a content store whose writes take their turn.
type Content struct {
	content.Store
	Turns *Turns
}

// Update implements content.Manager.
func (c Content) Update(ctx context.Context, info content.Info, fieldpaths ...string) (out content.Info, err error) {
	err = c.Turns.do(ctx, func() error {
		out, err = c.Store.Update(ctx, info, fieldpaths...)
		return err
	})
	return out, err
}

// Delete implements content.Manager.
func (c Content) Delete(ctx context.Context, dgst digest.Digest) error {
	return c.Turns.do(ctx, func() error { return c.Store.Delete(ctx, dgst) })
}

// Writer implements content.Ingester: opening a writer is a write (the
// ingest is recorded against the pull's lease), and so is its commit.
func (c Content) Writer(ctx context.Context, opts ...content.WriterOpt) (w content.Writer, err error) {
	err = c.Turns.do(ctx, func() error {
		w, err = c.Store.Writer(ctx, opts...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return writer{Writer: w, turns: c.Turns}, nil
}

type writer struct {
	content.Writer
	turns *Turns
}

func (w writer) Commit(ctx context.Context, size int64, expected digest.Digest, opts ...content.Opt) error {
	return w.turns.do(ctx, func() error { return w.Writer.Commit(ctx, size, expected, opts...) })
}

// Snapshotter is a snapshotter whose writes take their turn.
type Snapshotter struct {
	snapshots.Snapshotter
	Turns *Turns
}

// Prepare implements snapshots.Snapshotter.
func (s Snapshotter) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) (m []mount.Mount, err error) {
	err = s.Turns.do(ctx, func() error {
		m, err = s.Snapshotter.Prepare(ctx, key, parent, opts...)
		return err
	})
	return m, err
}

// View implements snapshots.Snapshotter.
func (s Snapshotter) View(ctx context.Context, key, parent string, opts ...snapshots.Opt) (m []mount.Mount, err error) {
	err = s.Turns.do(ctx, func() error {
		m, err = s.Snapshotter.View(ctx, key, parent, opts...)
		return err
	})
	return m, err
}

// Commit implements snapshots.Snapshotter.
func (s Snapshotter) Commit(ctx context.Context, name, key string, opts ...snapshots.Opt) error {
	return s.Turns.do(ctx, func() error { return s.Snapshotter.Commit(ctx, name, key, opts...) })
}

// Remove implements snapshots.Snapshotter.
func (s Snapshotter) Remove(ctx context.Context, key string) error {
	return s.Turns.do(ctx, func() error { return s.Snapshotter.Remove(ctx, key) })
}

// Images is an image store whose writes take their turn.
type Images struct {
	images.Store
	Turns *Turns
}

// Create implements images.Store.
func (s Images) Create(ctx context.Context, img images.Image) (out images.Image, err error) {
	err = s.Turns.do(ctx, func() error {
		out, err = s.Store.Create(ctx, img)
		return err
	})
	return out, err
}

// Update implements images.Store.
func (s Images) Update(ctx context.Context, img images.Image, fieldpaths ...string) (out images.Image, err error) {
	err = s.Turns.do(ctx, func() error {
		out, err = s.Store.Update(ctx, img, fieldpaths...)
		return err
	})
	return out, err
}
