// Package gate limits how many image pulls run at once on a node. Pulls
// beyond the limit wait for a slot, the way kubelet's parallel puller
// hands out tokens, but node-wide: CRI, ctr and the Pullwise API all share
// one gate. They are served in due order (lane.Ticket): the order they
// were asked in, except that a pull whose cost is known while it waits
// moves to when it would be done, so a sidecar's small image need not
// wait behind an application's large one asked for just before it.
package gate

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/pullwise/pullwise/transfer/lane"
)

// Gate hands out pull slots. The zero value is not usable; use New.
type Gate struct {
	limit   int // 0: unlimited
	timeout time.Duration

	mu      sync.Mutex
	running int
	waiting *list.List // of *waiter, in arrival order
}

type waiter struct {
	ready  chan struct{} // closed when the waiter is granted a slot
	ticket *lane.Ticket  // nil: due at arrival
	at     time.Time     // arrival
}

// due is where w stands in line now: its pull's due moves while it waits,
// once its cost is known.
func (w *waiter) due() time.Time { return w.ticket.DueOr(w.at) }

// New returns a gate with limit slots (0 is unlimited) whose waiters give up
// after timeout (0: only the caller's context decides).
func New(limit int, timeout time.Duration) *Gate {
	return &Gate{limit: limit, timeout: timeout, waiting: list.New()}
}

// Limit is the configured number of slots; 0 is unlimited.
func (g *Gate) Limit() int { return g.limit }

// Acquire takes a slot, waiting when none is free, in the order of the
// tickets of ctx (lane.WithTicket; without one, a pull is due when it
// arrives) and, between equal dues, of arrival. It returns
// the release func, which must be called exactly once, and how long it
// waited. A caller whose context ends while waiting leaves the queue and gets
// ctx.Err(); one that waits longer than the queue timeout gets an error
// wrapping errdefs.ErrResourceExhausted, which gRPC reports as
// ResourceExhausted. bypass takes a slot at once even when all are taken:
// for pulls a pod cannot start without, such as the sandbox image.
func (g *Gate) Acquire(ctx context.Context, bypass bool) (release func(), waited time.Duration, err error) {
	g.mu.Lock()
	if bypass || g.limit == 0 || (g.running < g.limit && g.waiting.Len() == 0) {
		g.running++
		g.mu.Unlock()
		return g.releaseOnce(), 0, nil
	}
	start := time.Now()
	w := &waiter{ready: make(chan struct{}), ticket: lane.TicketOf(ctx), at: start}
	elem := g.waiting.PushBack(w)
	g.mu.Unlock()

	var expired <-chan time.Time
	if g.timeout > 0 {
		t := time.NewTimer(g.timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w.ready:
		return g.releaseOnce(), time.Since(start), nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
		err = fmt.Errorf("too many image pulls in parallel: all %d slots (max_parallel_image_pulls) stayed taken for %s (pull_queue_timeout): %w",
			g.limit, g.timeout, errdefs.ErrResourceExhausted)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.ready:
		// Granted while giving up: pass the slot on rather than leak it.
		g.handOff()
	default:
		g.waiting.Remove(elem)
	}
	return nil, time.Since(start), err
}

// releaseOnce returns a release func that frees the slot once, however
// often it is called, so a deferred release and an early one cannot free two.
func (g *Gate) releaseOnce() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.handOff()
		})
	}
}

// handOff gives a freed slot to the first waiter in line, or returns it
// to the pool. g.mu must be held.
//
// The line is scanned, not kept in a heap: a waiter's due moves when its
// pull learns its size, and the queue is as long as the pulls a node has
// waiting, tens, at most hundreds.
func (g *Gate) handOff() {
	if g.waiting.Len() > 0 && (g.limit == 0 || g.running <= g.limit) {
		first := g.waiting.Front()
		for e, at := first.Next(), first.Value.(*waiter).due(); e != nil; e = e.Next() {
			if p := e.Value.(*waiter).due(); p.Before(at) {
				first, at = e, p
			}
		}
		g.waiting.Remove(first)
		close(first.Value.(*waiter).ready)
		return
	}
	g.running--
}

// Full reports whether a pull asking now would wait for a slot.
func (g *Gate) Full() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit > 0 && (g.running >= g.limit || g.waiting.Len() > 0)
}

// Running and Waiting report the gate's state for metrics.
func (g *Gate) Running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.running
}

// Waiting is the number of pulls queued for a slot.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting.Len()
}
