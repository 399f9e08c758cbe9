package gate

import (
	"sync"
	"time"

	"github.com/pullwise/pullwise/transfer/lane"
)

// Handback decides when a pull whose blobs are all in gives its slot back.
//
// Giving it back at once lets the next pull download while this one
// unpacks, which keeps the link busy. But where the CPUs are what limits,
// the next pull's download then competes for them with the unpacking of
// the pulls before it, and the first images come later. So only a few
// pulls unpack without their slot; the next one fetched keeps its slot
// until one of them is done. A pull never keeps its slot past its own
// end, so no pull holds a slot longer than it would if every pull held
// its slot to the end.
//
// A pull that is late, or ahead of every pull unpacking without its slot,
// gives its own back too, up to limit more (lane.Extra, the rule the
// unpack lane follows): a small pull must not keep a slot, and the pulls
// behind it waiting, for as long as a large image asked for with it takes
// to unpack.
type Handback struct {
	limit int

	mu    sync.Mutex
	extra lane.Extra
	early map[*Hold]struct{} // pulls unpacking without their slot
	held  []*Hold            // fetched pulls keeping their slot, in the order fetched
}

// NewHandback lets limit pulls at once unpack without their slot, and up
// to limit more that are late or ahead of all of them by slack (0: none).
func NewHandback(limit int, slack time.Duration) *Handback {
	limit = max(limit, 1)
	return &Handback{limit: limit, extra: lane.NewExtra(limit, slack), early: map[*Hold]struct{}{}}
}

// Hold is one pull's hold on its slot in the hand back.
type Hold struct {
	h       *Handback
	ticket  *lane.Ticket // nil: due when started
	started time.Time
	state   holdState
	extra   bool // gave its slot back beyond the limit
	release func()
}

// due is the pull's own due (lane.Ticket.OwnDue): extra places go by it,
// and a due the pull lends does not move it.
func (t *Hold) due() time.Time { return t.ticket.OwnDueOr(t.started) }

type holdState int

const (
	holdActive holdState = iota // downloading
	holdKept                    // fetched, keeping its slot
	holdEarly                   // fetched, slot given back
	holdDone
)

// Start begins the hold of a pull with ticket (lane.Ticket; nil: due
// now); call Done when the pull ends, however it ends. A nil Handback
// gives every slot back at once.
func (h *Handback) Start(ticket *lane.Ticket) *Hold {
	if h == nil {
		return nil
	}
	return &Hold{h: h, ticket: ticket, started: time.Now()}
}

// goEarly gives t's slot back if it may unpack without it, and reports
// whether it did. h.mu must be held.
func (h *Handback) goEarly(t *Hold) bool {
	extra := false
	if len(h.early) >= h.limit {
		if !h.extra.May(t.ticket, t.due(), h.earlyDues) {
			return false
		}
		extra = true
		h.extra.Take()
	}
	t.state, t.extra = holdEarly, extra
	h.early[t] = struct{}{}
	return true
}

// earlyDues yields the dues of the pulls unpacking without their slot.
// h.mu must be held.
func (h *Handback) earlyDues(yield func(time.Time) bool) {
	for e := range h.early {
		if !yield(e.due()) {
			return
		}
	}
}

// Fetched is called when every blob of the pull is in; release gives its
// slot back, now or when an earlier pull is done unpacking. It does not
// block.
func (t *Hold) Fetched(release func()) {
	if t == nil {
		release()
		return
	}
	h := t.h
	h.mu.Lock()
	if t.state != holdActive {
		h.mu.Unlock()
		return
	}
	if h.goEarly(t) {
		h.mu.Unlock()
		release()
		return
	}
	t.state, t.release = holdKept, release
	h.held = append(h.held, t)
	h.mu.Unlock()
}

// Done ends the hold. A pull that gave its slot back early lets the first
// held ones that may give back their own. The caller still releases its
// own slot as usual (release is idempotent).
func (t *Hold) Done() {
	if t == nil {
		return
	}
	h := t.h
	h.mu.Lock()
	var next []func()
	switch t.state {
	case holdEarly:
		delete(h.early, t)
		if t.extra {
			h.extra.Give()
		}
		for i := 0; i < len(h.held); {
			n := h.held[i]
			if !h.goEarly(n) {
				i++
				continue
			}
			h.held = append(h.held[:i], h.held[i+1:]...)
			next = append(next, n.release)
			n.release = nil
		}
	case holdKept:
		for i, n := range h.held {
			if n == t {
				h.held = append(h.held[:i], h.held[i+1:]...)
				break
			}
		}
	}
	t.state, t.release = holdDone, nil
	h.mu.Unlock()
	for _, release := range next {
		release()
	}
}

// Held is how many fetched pulls keep their slot, for tests.
func (h *Handback) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}
