package hostclient

import (
	"bytes"
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/log"

	"github.com/pullwise/pullwise/transfer/lane"
)

// body bounds how long one Read may wait for bytes, counts blob bytes, and
// ends the request's context when closed. Only time spent inside Read
// counts: a consumer that pauses (a slow disk, the download limiter) is not
// the registry stalling.
type body struct {
	io.ReadCloser
	cancel   context.CancelCauseFunc
	ctx      context.Context // the request's own, cancelled on a stall
	parent   context.Context // the caller's
	timeout  time.Duration
	add      func(int64)    // blob byte counter, or nil
	tee      func([]byte)   // sees every byte read, or nil
	share    io.WriteCloser // the blob's arrival for the node's peers, or nil
	download *place         // the download place, or nil
	flow     *lane.Flow     // the body on the node's link, with download; or nil
	places   *lane.Lane     // where download is taken again after a pause
	paused   bool           // yielding the link; only the reader reads it
	pausedAt time.Time      // when it paused, for its pull's waits (lane.WaitLink)
	eof      func()         // called at the end of a complete body, or nil
	failed   func(error)    // reports a body failure
	// read says at debug level when a blob body on the link ended, so
	// that a burst's debug log shows which bodies shared the link at a
	// time; nil for other bodies, and below debug level.
	read  *bodyRead
	once  sync.Once
	timer *time.Timer
}

func (b *body) Read(p []byte) (int, error) {
	if err := b.yield(); err != nil {
		return 0, err
	}
	if b.paused {
		p = p[:min(len(p), trickle)]
	}
	if b.timer != nil {
		b.timer.Reset(b.timeout)
	}
	n, err := b.ReadCloser.Read(p)
	if b.timer != nil {
		b.timer.Stop()
	}
	if n > 0 {
		b.moved(p[:n])
		b.read.moved(n)
	}
	if err == io.EOF && b.eof != nil {
		b.eof()
		b.eof = nil
	}
	if err == nil || err == io.EOF || b.failed == nil || b.parent.Err() != nil {
		return n, err
	}
	// The host cut the body off or stopped sending. Mark it, and tell
	// containerd in the one word that makes it resume where it stopped
	// (a Range request, which the health table now sends to the next
	// host). A later Read of this body fails the same way.
	b.once.Do(func() { b.failed(causeOf(b.ctx, err)) })
	return n, io.ErrUnexpectedEOF
}

// moved tells everyone who follows the body that p was read.
func (b *body) moved(p []byte) {
	if b.add != nil {
		b.add(int64(len(p)))
	}
	if b.download != nil {
		b.download.advance(len(p))
	}
	if b.flow != nil {
		b.flow.Moved()
	}
	if b.tee != nil {
		b.tee(p)
	}
	if b.share != nil {
		b.share.Write(p)
	}
}

func (b *body) Close() error {
	if b.timer != nil {
		b.timer.Stop()
	}
	if b.eof != nil {
		// A reader that stops at the expected size never sees EOF; a
		// body cut short does not parse.
		b.eof()
		b.eof = nil
	}
	err := b.ReadCloser.Close()
	b.cancel(nil)
	if b.download != nil {
		b.download.close()
	}
	if b.flow != nil {
		b.flow.Close()
	}
	if b.share != nil {
		b.share.Close()
	}
	b.read.done(b.parent)
	return err
}

// yield pauses the body while a pull that would finish well before its
// own is downloading (lane.Link), with its download place given back so
// that pull's requests can take it, and takes a place again after, in
// its pull's order. A body in its last round trip, its place given back
// already, reads on. The pause is not the host stalling: no timer runs.
//
// A paused body still reads a little every trickleEvery, while it gives
// way and while it waits for a place again: a sender, or a proxy between,
// whose writes block for long takes the connection for dead (nginx's
// send_timeout is 60 s).
func (b *body) yield() error {
	if b.flow == nil {
		return nil
	}
	if !b.paused {
		if !b.flow.Ask() || !b.download.held() {
			return nil
		}
		b.download.give()
		b.paused, b.pausedAt = true, time.Now()
	}
	// One deadline for both waits below, so that the trickle comes every
	// trickleEvery however the pause is spent between them.
	deadline := time.Now().Add(trickleEvery)
	behind, err := b.flow.Yield(b.ctx, trickleEvery)
	if err != nil || behind {
		return err
	}
	// The places may all be held for as long as a large body takes: the
	// wait for one is a pause too, and trickles like it. The body asks
	// again with its due unchanged; only its turn among equal dues moves.
	ctx, cancel := context.WithDeadline(b.ctx, deadline)
	release, err := b.places.Acquire(ctx)
	cancel()
	if err != nil {
		if b.ctx.Err() == nil {
			return nil
		}
		return err
	}
	b.download.retake(release)
	b.paused = false
	lane.TicketOf(b.ctx).Waited(lane.WaitLink, time.Since(b.pausedAt))
	b.read.paused(time.Since(b.pausedAt))
	return nil
}

// bodyRead is what a blob body's debug line says: its blob, when its
// request was sent, when its first and last bytes came, and how long it
// gave way. Atomic: Close may run concurrently with a Read to abort it.
type bodyRead struct {
	blob        string
	sent        time.Time
	first, last atomic.Int64 // UnixNano; 0: no byte yet
	n, gaveWay  atomic.Int64
	once        sync.Once
}

func (r *bodyRead) moved(n int) {
	if r == nil {
		return
	}
	now := time.Now().UnixNano()
	r.first.CompareAndSwap(0, now)
	r.last.Store(now)
	r.n.Add(int64(n))
}

func (r *bodyRead) paused(d time.Duration) {
	if r != nil {
		r.gaveWay.Add(int64(d))
	}
}

// done logs the line, once: Close may come twice.
func (r *bodyRead) done(ctx context.Context) {
	if r == nil {
		return
	}
	r.once.Do(func() {
		at := func(ns int64) time.Duration {
			if ns == 0 {
				return 0
			}
			return time.Unix(0, ns).Sub(r.sent)
		}
		log.G(ctx).WithFields(log.Fields{"blob": r.blob, "bytes": r.n.Load(), "first_byte": at(r.first.Load()), "last_byte": at(r.last.Load()), "took": time.Since(r.sent), "paused": time.Duration(r.gaveWay.Load())}).Debug("blob body read")
	})
}

// trickleEvery is how often a paused body reads (a var for tests), and
// trickle how much.
var trickleEvery = 5 * time.Second

const trickle = 4 << 10

// maxManifest bounds the manifest bytes kept for the observer; containerd
// itself refuses manifests over 4 MiB.
const maxManifest = 4 << 20

// manifestTee keeps the first maxManifest bytes of a manifest body, and
// none of a larger one.
type manifestTee struct {
	buf  bytes.Buffer
	full bool
}

func (t *manifestTee) add(p []byte) {
	if t.full {
		return
	}
	if t.buf.Len()+len(p) > maxManifest {
		t.full = true
		t.buf.Reset()
		return
	}
	t.buf.Write(p)
}
