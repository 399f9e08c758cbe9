// Package gate limits how many image pulls run at once on a node. Pulls
// beyond the limit wait for a slot, the way kubelet's parallel puller
// hands out tokens, but node-wide: CRI, ctr and the Pullwise API all share
// one gate. They are served in due order (lane.Ticket): the order they
// were asked in, except that a pull whose cost is known while it waits
// moves to when it would be done, so a sidecar's small image need not
// wait behind an application's large one asked for just before it.
//
// A pull whose bodies all give way on the link to pulls ahead of it
// (lane.Ticket.GivesWay) holds its slot but moves no bytes: while it
// does, the first pull in line, sized and ahead of it, takes a slot
// beside it, over the limit by at most one per such pull and never by
// more than the limit. Otherwise a large pull asked for first keeps a
// slot through a fetch that pauses for every small pull after it, and
// the small pulls share the other slots.
package gate

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/pullwise/pullwise/transfer/lane"
)

// Gate hands out pull slots. The zero value is not usable; use New.
type Gate struct {
	limit   int // 0: unlimited
	timeout time.Duration

	mu      sync.Mutex
	holders map[*holder]struct{} // the pulls holding slots, those beside included
	waiting *list.List           // of *waiter, in arrival order
	looking bool                 // look is running
}

// holder is a pull holding a slot.
type holder struct {
	ticket *lane.Ticket // nil: due at arrival
	at     time.Time    // arrival
	beside bool         // its slot was taken beside a pull giving way
}

// ownDue is the pull's own due (lane.Ticket.OwnDue): whom a pull gives
// way to goes by own dues, and so does the slot beside it.
func (h *holder) ownDue() time.Time { return h.ticket.OwnDueOr(h.at) }

type waiter struct {
	ready  chan struct{} // closed when the waiter is granted a slot
	holder *holder       // what it holds once granted
}

// due is where w stands in line now: its pull's due moves while it waits,
// once its cost is known.
func (w *waiter) due() time.Time { return w.holder.ticket.DueOr(w.holder.at) }

// New returns a gate with limit slots (0 is unlimited) whose waiters give up
// after timeout (0: only the caller's context decides).
func New(limit int, timeout time.Duration) *Gate {
	return &Gate{limit: limit, timeout: timeout, holders: map[*holder]struct{}{}, waiting: list.New()}
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
	start := time.Now()
	h := &holder{ticket: lane.TicketOf(ctx), at: start}
	g.mu.Lock()
	if bypass || g.limit == 0 || (len(g.holders) < g.limit && g.waiting.Len() == 0) {
		g.holders[h] = struct{}{}
		g.mu.Unlock()
		return g.releaseOnce(h), 0, nil
	}
	w := &waiter{ready: make(chan struct{}), holder: h}
	elem := g.waiting.PushBack(w)
	if !g.looking {
		g.looking = true
		go g.look()
	}
	g.mu.Unlock()

	var expired <-chan time.Time
	if g.timeout > 0 {
		t := time.NewTimer(g.timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-w.ready:
		if h.beside {
			log.G(ctx).Debug("pull took a slot beside one giving way")
		}
		return g.releaseOnce(h), time.Since(start), nil
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
		g.handOff(h)
	default:
		g.waiting.Remove(elem)
	}
	return nil, time.Since(start), err
}

// grant wakes the waiter w, taken out of line, as a holder. g.mu must
// be held.
func (g *Gate) grant(w *waiter) {
	g.holders[w.holder] = struct{}{}
	close(w.ready)
}

// look gives the first waiter in line a slot beside pulls giving way
// (grantBesides), every lane.Poll while pulls wait: a pull giving way
// says so on its ticket, not to the gate. One look per gate, not one
// per waiter: a line may be hundreds long, and each look scans it.
func (g *Gate) look() {
	t := time.NewTicker(lane.Poll)
	defer t.Stop()
	for range t.C {
		g.mu.Lock()
		if g.waiting.Len() == 0 {
			g.looking = false
			g.mu.Unlock()
			return
		}
		g.grantBesides()
		g.mu.Unlock()
	}
}

// grantBesides grants the first waiter in line a slot beside pulls
// giving way, while there are more of them, ahead of which it is due by
// the slack, than slots taken over the limit, and fewer over it than
// the limit. A
// waiter not yet sized is due at its arrival, not ahead of anyone; a late
// holder reads on at its bodies' next look. g.mu must be held.
func (g *Gate) grantBesides() {
	for g.waiting.Len() > 0 && len(g.holders)-g.limit < g.limit {
		first := g.first()
		w := first.Value.(*waiter)
		if _, sized := w.holder.ticket.Cost(); !sized {
			return
		}
		mine, now, aside := w.holder.ownDue(), time.Now(), 0
		for h := range g.holders {
			if lane.Ahead(mine, h.ownDue(), lane.Slack) && !h.ticket.Late(now) && h.ticket.GivesWay() {
				aside++
			}
		}
		if aside <= len(g.holders)-g.limit {
			return
		}
		g.waiting.Remove(first)
		w.holder.beside = true
		g.grant(w)
	}
}

// releaseOnce returns a release func that frees h's slot once, however
// often it is called, so a deferred release and an early one cannot free
// two.
func (g *Gate) releaseOnce(h *holder) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			g.handOff(h)
		})
	}
}

// handOff frees h's slot: it goes to the first waiter in line, or back
// to the pool. While slots are taken over the limit (grantBesides), a freed
// slot is not handed on: it ends one of those. g.mu must be held.
func (g *Gate) handOff(h *holder) {
	delete(g.holders, h)
	if g.waiting.Len() > 0 && (g.limit == 0 || len(g.holders) < g.limit) {
		first := g.first()
		g.waiting.Remove(first)
		g.grant(first.Value.(*waiter))
	}
}

// first is the waiter first in line: earliest due, and between equal
// dues, first to arrive. g.mu must be held, and a waiter waiting.
//
// The line is scanned, not kept in a heap: a waiter's due moves when its
// pull learns its size, and the queue is as long as the pulls a node has
// waiting, tens, at most hundreds.
func (g *Gate) first() *list.Element {
	first := g.waiting.Front()
	for e, at := first.Next(), first.Value.(*waiter).due(); e != nil; e = e.Next() {
		if p := e.Value.(*waiter).due(); p.Before(at) {
			first, at = e, p
		}
	}
	return first
}

// Full reports whether a pull asking now would wait for a slot.
func (g *Gate) Full() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit > 0 && (len(g.holders) >= g.limit || g.waiting.Len() > 0)
}

// Running and Waiting report the gate's state for metrics.
func (g *Gate) Running() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.holders)
}

// Waiting is the number of pulls queued for a slot.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting.Len()
}
