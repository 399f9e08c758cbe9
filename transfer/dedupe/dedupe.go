// Package dedupe shares one pull among concurrent callers asking for the
// same image. Unlike singleflight, the shared work is cancelled once every
// caller has given up, and each caller keeps receiving the pull's progress
// events, since CRI cancels a pull that reports no progress.
package dedupe

import (
	"context"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"
)

// progressBuffer bounds the events queued for one caller; beyond it events
// are dropped rather than slowing the pull. Events are snapshots of a
// layer's state, so a dropped one is superseded by the next.
const progressBuffer = 1024

// drainTimeout bounds how long a finished caller waits for its queued
// progress events to be delivered before returning.
const drainTimeout = 2 * time.Second

// Group runs one function per key at a time. The zero value is ready.
type Group struct {
	mu    sync.Mutex
	calls map[string]*call
}

type call struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when fn returned; err is then set
	err    error

	mu      sync.Mutex
	callers map[*forwarder]struct{}
}

// Func is the shared work. Its context ends when every caller has left; its
// progress func fans out to every caller still waiting and never blocks.
type Func func(ctx context.Context, progress func(transfer.Progress)) error

// Do runs fn for key, or joins the run already in flight for key, and
// returns its error. shared reports that the caller joined a run started by
// another. A caller whose ctx ends gets ctx.Err() at once; the run goes on
// for the others. progress may be nil.
func (g *Group) Do(ctx context.Context, key string, progress func(transfer.Progress), fn Func) (shared bool, err error) {
	fwd := newForwarder(ctx, progress)

	g.mu.Lock()
	if g.calls == nil {
		g.calls = make(map[string]*call)
	}
	c, shared := g.calls[key]
	if !shared {
		// The run outlives any one caller but keeps the first caller's
		// values (namespace, lease, pod identity).
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		c = &call{cancel: cancel, done: make(chan struct{}), callers: make(map[*forwarder]struct{})}
		g.calls[key] = c
		c.callers[fwd] = struct{}{}
		go g.run(runCtx, key, c, fn)
	} else {
		c.mu.Lock()
		c.callers[fwd] = struct{}{}
		c.mu.Unlock()
	}
	g.mu.Unlock()

	select {
	case <-c.done:
		err = c.err
	case <-ctx.Done():
		err = ctx.Err()
	}
	g.leave(key, c, fwd)
	fwd.finish(ctx)
	return shared, err
}

func (g *Group) run(ctx context.Context, key string, c *call, fn Func) {
	defer c.cancel()
	c.err = fn(ctx, c.broadcast)
	// Forget the key before waking callers, so a pull that starts after
	// this one returned does a fresh run instead of joining a finished one.
	g.forget(key, c)
	close(c.done)
}

func (g *Group) forget(key string, c *call) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.calls[key] == c {
		delete(g.calls, key)
	}
}

// leave removes a caller; the last one out cancels the run and forgets the
// key, so a caller arriving later starts afresh instead of joining a run
// that is being cancelled.
func (g *Group) leave(key string, c *call, fwd *forwarder) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c.mu.Lock()
	delete(c.callers, fwd)
	last := len(c.callers) == 0
	c.mu.Unlock()
	if last {
		if g.calls[key] == c {
			delete(g.calls, key)
		}
		c.cancel()
	}
}

func (c *call) broadcast(p transfer.Progress) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for f := range c.callers {
		f.send(p)
	}
}

// forwarder delivers one caller's progress events from its own goroutine, so
// a caller whose progress func blocks (CRI's does when nobody reads its
// reporter, see containerd#14158) cannot hold up the pull.
type forwarder struct {
	events chan transfer.Progress // nil when the caller has no progress func
	ended  chan struct{}          // closed when the goroutine returned
	once   sync.Once
}

func newForwarder(ctx context.Context, progress func(transfer.Progress)) *forwarder {
	f := &forwarder{ended: make(chan struct{})}
	if progress == nil {
		close(f.ended)
		return f
	}
	f.events = make(chan transfer.Progress, progressBuffer)
	go func() {
		defer close(f.ended)
		for {
			select {
			case p, ok := <-f.events:
				if !ok {
					return
				}
				progress(p)
			case <-ctx.Done():
				return
			}
		}
	}()
	return f
}

// send never blocks. Called with the call's lock held, before finish.
func (f *forwarder) send(p transfer.Progress) {
	if f.events == nil {
		return
	}
	select {
	case f.events <- p:
	default:
	}
}

// finish stops accepting events and waits, briefly, for the queued ones to
// reach the caller. The goroutine ends by itself once they are delivered or
// the caller's context ends.
func (f *forwarder) finish(ctx context.Context) {
	f.once.Do(func() {
		if f.events != nil {
			close(f.events)
		}
	})
	t := time.NewTimer(drainTimeout)
	defer t.Stop()
	select {
	case <-f.ended:
	case <-ctx.Done():
	case <-t.C:
	}
}

// Callers is the number of callers waiting on runs in flight.
func (g *Group) Callers() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, c := range g.calls {
		n += c.count()
	}
	return n
}

// CallersOf is the number of callers waiting on the run for key.
func (g *Group) CallersOf(key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.calls[key]; c != nil {
		return c.count()
	}
	return 0
}

func (c *call) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.callers)
}
