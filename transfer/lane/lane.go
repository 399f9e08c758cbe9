// Package lane orders work that many pulls of a node share, such as blob
// downloads and layer unpacking: at most a few at once, oldest pull first.
//
// containerd's limiters are FIFO queues of single layers. A burst of pulls
// therefore shares the link, the CPUs and the disk evenly, and every image
// is done at about the same time, late. Serving the oldest pull first
// finishes images one after another while younger pulls use what is left:
// the first pods start early and nothing idles that a later pull could
// use. No pull waits behind one that was asked for after it.
//
// A priority queue is written here because no semaphore in the standard
// library or golang.org/x/sync orders its waiters by anything but arrival.
package lane

import (
	"container/heap"
	"context"
	"iter"
	"sync"
	"sync/atomic"
	"time"
)

// Lane hands out places, oldest pull first.
type Lane struct {
	limit int // 0: unlimited
	// slack, when set, lets work due more than slack before everything
	// holding a place take a place beyond the limit (Overtaking).
	slack time.Duration

	// plain gives back a place of a lane without holders; one func for
	// every place, so that a download does not allocate one per blob.
	plain func()

	mu      sync.Mutex
	running int
	extra   int                  // places beyond the limit, up to limit
	holders map[*holder]struct{} // with slack: the places held, by ticket
	waiting queue
	seq     uint64 // breaks ties between equal tickets, first come first
}

// holder is a place held, with its work's ticket, for Overtaking.
type holder struct {
	ticket *Ticket
	at     time.Time // the place of work without a ticket
	extra  bool
}

func (h *holder) place() time.Time {
	if h.ticket != nil {
		return h.ticket.Place()
	}
	return h.at
}

// New returns a lane with limit places; 0 is unlimited.
func New(limit int) *Lane {
	l := &Lane{limit: max(limit, 0)}
	l.plain = func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.free(nil)
	}
	return l
}

// Overtaking returns a lane with limit places where work due more than
// slack before all the work holding places does not wait for them: it
// takes a place beyond the limit, up to limit more. A place is held to the
// end of its work, a layer's unpacking say, which for a layer of hundreds
// of MiB is tens of seconds; a small pull asked for at the same time
// would wait that long for a CPU that the operating system would share.
func Overtaking(limit int, slack time.Duration) *Lane {
	return &Lane{limit: max(limit, 0), slack: slack, holders: map[*holder]struct{}{}}
}

// Rate turns the bytes a pull must fetch into time, for its place in line
// (Ticket.Size): about what a node's link and disks move.
const Rate = 100 << 20 // bytes per second

// Ticket is a pull's place in line. It starts at the time the pull was
// asked for. Once the pull knows how many bytes it must fetch, Size moves
// it to when the pull would be done, had it the node to itself at Rate.
// Pulls of about the same size then keep the order they were asked in,
// and a small pull asked for a little after a large one goes first: with
// oldest first, a sidecar's image would wait for every layer of an
// application image asked for just before it. A pull is overtaken only by
// pulls asked for less than (its bytes − theirs) / Rate after it.
type Ticket struct {
	asked time.Time
	place atomic.Int64 // UnixNano
}

// NewTicket returns the ticket of a pull asked for at asked.
func NewTicket(asked time.Time) *Ticket {
	t := &Ticket{asked: asked}
	t.place.Store(asked.UnixNano())
	return t
}

// Size places the pull by the bytes it must fetch. Work already in line
// keeps its place; work that lines up after uses the new one.
func (t *Ticket) Size(bytes int64) {
	t.place.Store(t.asked.Add(time.Duration(float64(bytes) / Rate * float64(time.Second))).UnixNano())
}

type ticketKey struct{}

// WithTicket marks ctx's work with its pull's ticket. Work without a
// ticket lines up at the time it asks.
func WithTicket(ctx context.Context, t *Ticket) context.Context {
	return context.WithValue(ctx, ticketKey{}, t)
}

// TicketOf returns the ticket WithTicket gave ctx, or nil.
func TicketOf(ctx context.Context) *Ticket {
	t, _ := ctx.Value(ticketKey{}).(*Ticket)
	return t
}

// Place is where the pull stands in line now: when it was asked for,
// moved by its size once known.
func (t *Ticket) Place() time.Time { return time.Unix(0, t.place.Load()) }

func ticketFrom(ctx context.Context) time.Time {
	if t := TicketOf(ctx); t != nil {
		return t.Place()
	}
	return time.Now()
}

type waiter struct {
	ticket time.Time
	seq    uint64
	ready  chan struct{}
	index  int     // in the heap; -1 once granted
	owner  *Ticket // the work's ticket, or nil
	held   *holder // the place granted, with slack; set before ready closes
}

// Acquire waits for a place, in ticket order (oldest first), and returns
// the func that gives it back, which must be called exactly once. A caller
// whose context ends while waiting leaves the line and gets ctx.Err().
func (l *Lane) Acquire(ctx context.Context) (release func(), err error) {
	h, err := l.acquire(ctx)
	if err != nil {
		return nil, err
	}
	return l.releaser(h), nil
}

// acquire is Acquire, returning the place held: nil in a lane without
// holders.
func (l *Lane) acquire(ctx context.Context) (*holder, error) {
	l.mu.Lock()
	if l.limit == 0 || (l.running < l.limit && l.waiting.Len() == 0) {
		l.running++
		h := l.hold(TicketOf(ctx), time.Now(), false)
		l.mu.Unlock()
		return h, nil
	}
	if l.overtakes(ticketFrom(ctx)) {
		l.running++
		l.extra++
		h := l.hold(TicketOf(ctx), time.Now(), true)
		l.mu.Unlock()
		return h, nil
	}
	l.seq++
	w := &waiter{ticket: ticketFrom(ctx), seq: l.seq, ready: make(chan struct{}), owner: TicketOf(ctx)}
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

// overtakes reports whether work placed at mine is due more than slack
// before all the work holding places, with an extra place left. l.mu must
// be held.
func (l *Lane) overtakes(mine time.Time) bool {
	if l.slack == 0 || l.extra >= l.limit || len(l.holders) == 0 {
		return false
	}
	return AheadOfAll(mine, l.slack, l.places)
}

// places yields the places of the work holding places. l.mu must be held.
func (l *Lane) places(yield func(time.Time) bool) {
	for h := range l.holders {
		if !yield(h.place()) {
			return
		}
	}
}

// Ahead reports whether work placed at mine is due more than slack before
// work placed at other. Every overtaking and every pause asks it, so that
// pulls of about the same size keep sharing as they would without.
func Ahead(mine, other time.Time, slack time.Duration) bool {
	return mine.Add(slack).Before(other)
}

// AheadOfAll reports whether work placed at mine is Ahead of each of
// others.
func AheadOfAll(mine time.Time, slack time.Duration, others iter.Seq[time.Time]) bool {
	for o := range others {
		if !Ahead(mine, o, slack) {
			return false
		}
	}
	return true
}

// hold records a place held by work with ticket t (nil: placed at at).
// l.mu must be held.
func (l *Lane) hold(t *Ticket, at time.Time, extra bool) *holder {
	if l.holders == nil {
		return nil
	}
	h := &holder{ticket: t, at: at, extra: extra}
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

// free gives h's place back and hands free places to the oldest waiters.
// l.mu must be held.
func (l *Lane) free(h *holder) {
	l.running--
	if h != nil {
		delete(l.holders, h)
		if h.extra {
			l.extra--
		}
	}
	for l.waiting.Len() > 0 && (l.limit == 0 || l.running < l.limit) {
		l.grant(false)
	}
	// An extra place given back goes to the first in line if it may
	// overtake: otherwise work that found the extra places taken would
	// wait for a holder it was due well before, for tens of seconds
	// behind a large layer.
	for l.waiting.Len() > 0 && l.overtakes(l.waiting[0].ticket) {
		l.grant(true)
	}
}

// grant gives the first in line a place. l.mu must be held.
func (l *Lane) grant(extra bool) {
	w := heap.Pop(&l.waiting).(*waiter)
	l.running++
	if extra {
		l.extra++
	}
	w.held = l.hold(w.owner, w.ticket, extra)
	close(w.ready)
}

// First is the ticket of the first in line, if any.
func (l *Lane) First() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting.Len() == 0 {
		return time.Time{}, false
	}
	return l.waiting[0].ticket, true
}

// Waiting is how many are in line, for tests and metrics.
func (l *Lane) Waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting.Len()
}

// queue is a heap of waiters, oldest ticket first.
type queue []*waiter

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if !q[i].ticket.Equal(q[j].ticket) {
		return q[i].ticket.Before(q[j].ticket)
	}
	return q[i].seq < q[j].seq
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
