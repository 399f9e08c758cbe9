package lane

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Link shares the node's download link between blob bodies by ticket. A
// body of a pull that would finish well after another pull whose bodies
// are arriving, or waiting for a download place, pauses until they are
// in, so the link goes to the pull that would finish first.
//
// Download places alone cannot do that: a place is held for a whole body,
// and a node's link is shared by its connections, not by pulls: a large
// image asked for with small ones takes every place and most of the link,
// and the small images wait behind it (BenchmarkCorpusBigAndSmall/wan
// measures it). A paused reader stops
// its sender within a TCP window or an HTTP/2 stream window, and the
// bandwidth goes to the connections still read.
type Link struct {
	// Slack is how much earlier another pull's ticket must be for a body
	// to pause: pulls of about the same size share the link as before.
	Slack time.Duration

	// inflight, if set, pauses a body also while a pull ahead of it is
	// in flight and tasks wait for a CPU: on a node whose CPUs are what
	// limits, a body's checksum and writes take them from the pull ahead.
	inflight *InFlight

	now func() time.Time // time.Now; tests set it

	mu    sync.Mutex
	flows map[*Flow]struct{}
}

// active is how recently a body must have delivered bytes to count as
// using the link: one whose reader stopped (a full disk queue, a
// cancelled pull) must not hold others back.
const active = 100 * time.Millisecond

// NewLink returns a link that pauses bodies behind pulls at least slack
// earlier.
func NewLink(slack time.Duration) *Link {
	return &Link{Slack: slack, flows: map[*Flow]struct{}{}, now: time.Now}
}

// GiveWay makes the bodies on l give way also to the pulls in flight ahead
// of them while tasks wait for a CPU (InFlight). Call it before the link
// is used.
func (l *Link) GiveWay(f *InFlight) { l.inflight = f }

// Flow is one body on the link.
type Flow struct {
	link   *Link
	places *Lane     // the download places the body holds one of, or nil
	ticket *Ticket   // nil: placed at open
	opened time.Time // the place of a flow without a ticket
	// moved is when the body last delivered bytes (UnixNano). Atomic: it
	// is set on every Read of every body, and a lock there would be taken
	// thousands of times a second on a fast link.
	moved atomic.Int64
	asked every // Ask's; only the body's reader
}

// Open adds a body of the pull that ctx's ticket belongs to, holding one
// of places.
func (l *Link) Open(ctx context.Context, places *Lane) *Flow {
	f := l.Unasked(ctx, places)
	l.mu.Lock()
	l.flows[f] = struct{}{}
	l.mu.Unlock()
	return f
}

func (f *Flow) due() time.Time { return f.ticket.DueOr(f.opened) }

// ownDue is when f's pull is due to the bodies that would give way to it:
// its own due, not one it lends (Ticket.OwnDue).
func (f *Flow) ownDue() time.Time { return f.ticket.OwnDueOr(f.opened) }

// Moved records that the body delivered bytes.
func (f *Flow) Moved() {
	f.moved.Store(f.link.now().UnixNano())
}

// Close removes the body from the link.
func (f *Flow) Close() {
	f.link.mu.Lock()
	delete(f.link.flows, f)
	f.link.mu.Unlock()
}

// Behind reports whether a body of a pull Ahead of this one is arriving
// now, or such a pull waits for a download place: all places may be this
// pull's, and its bodies give way only to bodies that move. A late pull's
// body gives way to nobody.
func (f *Flow) Behind() bool {
	l := f.link
	if f.ticket.Late(l.now()) {
		return false
	}
	mine := f.due()
	if f.places != nil {
		if first, ok := f.places.First(); ok && Ahead(first, mine, l.Slack) {
			return true
		}
	}
	recent := l.now().Add(-active).UnixNano()
	l.mu.Lock()
	for o := range l.flows {
		if o != f && o.moved.Load() > recent && Ahead(o.ownDue(), mine, l.Slack) {
			l.mu.Unlock()
			return true
		}
	}
	l.mu.Unlock()
	return l.inflight.Behind(f.ticket, mine)
}

// Unasked is a body of ctx's pull not asked for yet, holding one of
// places once it is, to ask whether it would be Behind before its request
// goes out (nil on a nil link). A request sent only for its body to pause
// at the first Read takes a download place from the pull it gives way to,
// and what its sender gets out before the pause takes the link from that
// pull. With a pull ahead in flight on a busy CPU, each of a large pull's
// waiting layers would be asked for in turn, each taking the place the
// one before gave up, while the pull ahead was still asking for its
// manifests. The body it stands for is not on the link: it holds no one
// back.
func (l *Link) Unasked(ctx context.Context, places *Lane) *Flow {
	if l == nil {
		return nil
	}
	return &Flow{link: l, places: places, ticket: TicketOf(ctx), opened: l.now()}
}

// Ask reports whether f is Behind, asking the link at most every poll and
// answering false in between; only the body's reader calls it, before
// every Read.
func (f *Flow) Ask() bool {
	return f.asked.due() && f.Behind()
}

// Wait waits while f is Behind.
func (f *Flow) Wait(ctx context.Context) error {
	_, err := waitWhile(ctx, f.Behind, nil)
	return err
}

// Yield waits while f is Behind, at most for limit, and reports whether
// it still is.
func (f *Flow) Yield(ctx context.Context, limit time.Duration) (behind bool, err error) {
	if !f.Behind() {
		return false, nil
	}
	return waitWhile(ctx, f.Behind, time.After(limit))
}
