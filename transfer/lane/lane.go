package lane

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Lane hands out places in due order (Ticket): a download place, or a
// place to write a layer.
type Lane struct {
	limit int // 0: unlimited

	// plain gives back a place of a lane without holders; one func for
	// every place, so that a download does not allocate one per blob.
	plain func()

	mu      sync.Mutex
	running int
	extra   Extra
	holders map[*holder]struct{} // in an overtaking lane: the places held
	waiting queue
	seq     uint64 // breaks ties between equal dues, first come first

	inflight *InFlight // nil: layers give way only to layers (Pacer)
}

// holder is a place held, with its work's ticket.
type holder struct {
	ticket *Ticket
	at     time.Time // the due of work without a ticket
	guard  string    // the lock the work is done under (Guards), or ""
	extra  bool
	queued *queued // why the work waited in line for its place; nil: it did not
}

// queued is the lane as work found it when it had to wait in line: what
// kept it from a place at once, and from an extra one (Extra). Debug lines
// give it, since a wait is explained by the lane at its start, not at its
// end.
type queued struct {
	running, extra int // places held, and how many of them extra
	late           bool
	// lead is how long before the earliest-due holder the work is due
	// (own dues, or a lock's, holder.ownDue); unless late, it takes an
	// extra place only when lead > slack.
	lead time.Duration
}

// due is when h's work is due for its own turns: whether it gives way
// (Pacer), a lent due included (Ticket.Due).
func (h *holder) due() time.Time { return h.ticket.DueOr(h.at) }

// ownDue is when h's work is due to work that would pass it or give way
// to it: its pull's own due, or the due lent on the lock it is done under
// (Ticket.OwnDueUnder). A due lent to the whole pull moves the lender's
// work up in line and keeps its layers from pausing; it must not also
// keep other pulls from passing the lender's other layers that hold
// places.
func (h *holder) ownDue() time.Time { return h.ticket.OwnDueUnder(h.guard, h.at) }

// New returns a lane with limit places; 0 is unlimited. Work waits in due
// order and never takes a place beyond the limit.
func New(limit int) *Lane {
	l := &Lane{limit: max(limit, 0)}
	l.plain = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.free(nil)
	}
	return l
}

// Overtaking returns a lane with limit places where work that is late, or
// Ahead of all the work holding places by slack, takes a place beyond the
// limit, up to limit more (Extra), and where layers give way (Pacer).
func Overtaking(limit int, slack time.Duration) *Lane {
	return &Lane{limit: max(limit, 0), extra: NewExtra(max(limit, 0), slack), holders: map[*holder]struct{}{}}
}

// GiveWay makes the layers written in l give way also to the pulls in
// flight ahead of them while tasks wait for a CPU (InFlight). Call it
// before the lane is used.
func (l *Lane) GiveWay(f *InFlight) { l.inflight = f }

type waiter struct {
	due    time.Time
	seq    uint64
	ready  chan struct{}
	index  int     // in the heap; -1 once granted
	owner  *Ticket // the work's ticket, or nil
	guard  string  // the lock the work is done under (Guards), or ""
	held   *holder // the place granted, in an overtaking lane; set before ready closes
	queued *queued // nil in a lane without holders
}

// ownDue is when w's work is due by its own pull's ask and cost, or the
// due lent on the lock it is done under (holder.ownDue), not its place in
// line (due), which a due lent to the whole pull may have moved up.
func (w *waiter) ownDue() time.Time { return w.owner.OwnDueUnder(w.guard, w.due) }

// Acquire waits for a place, in due order, and returns the func that
// gives it back, which must be called exactly once. A caller whose context
// ends while waiting leaves the line and gets ctx.Err().
func (l *Lane) Acquire(ctx context.Context) (release func(), err error) {
	h, err := l.acquire(ctx, "")
	if err != nil {
		return nil, err
	}
	return l.releaser(h), nil
}

// acquire is Acquire for work done under the lock guard (Guards; "" for
// none), returning the place held: nil in a lane without holders.
func (l *Lane) acquire(ctx context.Context, guard string) (*holder, error) {
	t := TicketOf(ctx)
	now := time.Now()
	due := t.DueOr(now)
	l.mu.Lock()
	if l.limit == 0 || (l.running < l.limit && l.waiting.Len() == 0) {
		h := l.take(t, due, false, guard)
		l.mu.Unlock()
		return h, nil
	}
	if l.extra.May(t, t.OwnDueUnder(guard, now), l.dues) {
		h := l.take(t, due, true, guard)
		l.mu.Unlock()
		return h, nil
	}
	l.seq++
	w := &waiter{due: due, seq: l.seq, ready: make(chan struct{}), owner: t, guard: guard, queued: l.queuedNow(t, guard, now)}
	heap.Push(&l.waiting, w)
	l.mu.Unlock()

	select {
	case <-w.ready:
		return w.held, nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-w.ready:
		// Granted while giving up: pass the place on rather than leak it.
		l.free(w.held)
	default:
		heap.Remove(&l.waiting, w.index)
	}
	return nil, ctx.Err()
}

// dues yields the own dues of the work holding places (holder.ownDue).
// l.mu must be held.
func (l *Lane) dues(yield func(time.Time) bool) {
	for h := range l.holders {
		if !yield(h.ownDue()) {
			return
		}
	}
}

// queuedNow is the lane as work with ticket t, done under the lock guard,
// finds it at now; nil in a lane without holders. l.mu must be held.
func (l *Lane) queuedNow(t *Ticket, guard string, now time.Time) *queued {
	if l.holders == nil {
		return nil
	}
	mine := t.OwnDueUnder(guard, now)
	q := &queued{running: l.running, extra: l.extra.Taken(), late: t.Late(now)}
	first := true
	for d := range l.dues {
		if lead := d.Sub(mine); first || lead < q.lead {
			q.lead, first = lead, false
		}
	}
	return q
}

// take gives work with ticket t (nil: due at due), done under the lock
// guard, a place, extra or not, and returns its holder: nil in a lane
// without holders. l.mu must be held.
func (l *Lane) take(t *Ticket, due time.Time, extra bool, guard string) *holder {
	l.running++
	if extra {
		l.extra.Take()
	}
	if l.holders == nil {
		return nil
	}
	h := &holder{ticket: t, at: due, extra: extra, guard: guard}
	l.holders[h] = struct{}{}
	return h
}

func (l *Lane) releaser(h *holder) func() {
	if h == nil && l.plain != nil {
		return l.plain
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.free(h)
	}
}

// free gives h's place back and hands free places to the first in line.
// l.mu must be held.
func (l *Lane) free(h *holder) {
	l.running--
	if h != nil {
		delete(l.holders, h)
		if h.extra {
			l.extra.Give()
		}
	}
	for l.waiting.Len() > 0 && (l.limit == 0 || l.running < l.limit) {
		l.grant(heap.Pop(&l.waiting).(*waiter), false)
	}
	l.grantExtras()
}

// grantExtras gives extra places to the work in line that may take one,
// earliest due first, when one is given back or a lock lends. l.mu must be
// held.
//
// Otherwise work that found the extra places taken would wait for a
// holder it was due well before, or after its own due. Not only to the
// first in line: the line is ordered by dues a lock lends (Lend), extra
// places by own dues, so work that may not take one (a lender's layer not
// under the lock waited on, or work without a ticket) can be first in line
// while a late pull behind it may, and would wait while newcomers took
// the place.
func (l *Lane) grantExtras() {
	for {
		w := l.firstMayExtra()
		if w == nil {
			break
		}
		heap.Remove(&l.waiting, w.index)
		l.grant(w, true)
	}
}

// firstMayExtra is the first in line that may take an extra place, or
// nil. l.mu must be held.
func (l *Lane) firstMayExtra() *waiter {
	var first *waiter
	for _, w := range l.waiting {
		if (first == nil || w.before(first)) && l.extra.May(w.owner, w.ownDue(), l.dues) {
			first = w
		}
	}
	return first
}

// grant gives w, taken out of line, a place. l.mu must be held.
func (l *Lane) grant(w *waiter, extra bool) {
	w.held = l.take(w.owner, w.due, extra, w.guard)
	if w.held != nil {
		w.held.queued = w.queued
	}
	close(w.ready)
}

// Lend moves the work of t waiting in line up to t's Due, which a lock t
// holds may have made earlier (KeyedLock): a layer of a pull that others
// wait on must not wait behind work due after them. Work of t done under
// a lock that is now waited on may take an extra place at once
// (Ticket.OwnDueUnder), and so may any work in line that may take one now.
func (l *Lane) Lend(t *Ticket) {
	due := t.Due()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.waiting {
		if w.owner == t && due.Before(w.due) {
			w.due = due
			heap.Fix(&l.waiting, w.index)
		}
	}
	l.grantExtras()
}

// First is the own due of the first in line (waiter.ownDue), if any: work
// gives way to it by that, not by a due its whole pull lends.
func (l *Lane) First() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting.Len() == 0 {
		return time.Time{}, false
	}
	return l.waiting[0].ownDue(), true
}

// FirstOwner is the ticket of the first in line, or nil, for tests: a
// lend has reached the line once the lender's work is first.
func (l *Lane) FirstOwner() *Ticket {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting.Len() == 0 {
		return nil
	}
	return l.waiting[0].owner
}

// Waiting is how many are in line, for tests and metrics.
func (l *Lane) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting.Len()
}

// queue is a heap of waiters, earliest due first.
type queue []*waiter

func (q queue) Len() int           { return len(q) }
func (q queue) Less(i, j int) bool { return q[i].before(q[j]) }

// before reports whether w is served before o: earlier due, or as due
// and in line first.
func (w *waiter) before(o *waiter) bool {
	if !w.due.Equal(o.due) {
		return w.due.Before(o.due)
	}
	return w.seq < o.seq
}
func (q queue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *queue) Push(x any) {
	w := x.(*waiter)
	w.index = len(*q)
	*q = append(*q, w)
}
func (q *queue) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	w.index = -1
	return w
}
