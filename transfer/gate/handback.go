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
// With a slack, a pull due more than slack before every pull unpacking
// without its slot gives its own back too, up to limit more: a small pull
// must not keep a slot, and the pulls behind it waiting, for as long as a
// large image asked for with it takes to unpack.
type Handback struct {
	limit int
	slack time.Duration // 0: no overtaking

	mu    sync.Mutex
	early map[*Turn]struct{} // pulls unpacking without their slot
	extra int                // of those, beyond the limit
	held  []*Turn            // fetched pulls keeping their slot, oldest first
}

// NewHandback lets limit pulls at once unpack without their slot, and up
// to limit more that are due more than slack before all of them (0: none).
func NewHandback(limit int, slack time.Duration) *Handback {
	return &Handback{limit: max(limit, 1), slack: slack, early: map[*Turn]struct{}{}}
}

// Turn is one pull's part in the hand back.
type Turn struct {
	h       *Handback
	ticket  *lane.Ticket // nil: placed when started
	started time.Time
	state   turnState
	extra   bool // gave its slot back beyond the limit
	release func()
}

func (t *Turn) place() time.Time {
	if t.ticket != nil {
		return t.ticket.Place()
	}
	return t.started
}

type turnState int

const (
	turnActive turnState = iota // downloading
	turnHeld                    // fetched, keeping its slot
	turnEarly                   // fetched, slot given back
	turnDone
)

// Start begins the turn of a pull placed by ticket (lane.Ticket; nil:
// now); call Done when the pull ends, however it ends. A nil Handback
// gives every slot back at once.
func (h *Handback) Start(ticket *lane.Ticket) *Turn {
	if h == nil {
		return nil
	}
	return &Turn{h: h, ticket: ticket, started: time.Now()}
}

// goEarly gives t's slot back if it may unpack without it, and reports
// whether it did. h.mu must be held.
func (h *Handback) goEarly(t *Turn) bool {
	extra := false
	if len(h.early) >= h.limit {
		if h.slack == 0 || h.extra >= h.limit {
			return false
		}
		if !lane.AheadOfAll(t.place(), h.slack, h.earlyPlaces) {
			return false
		}
		extra = true
	}
	t.state, t.extra = turnEarly, extra
	h.early[t] = struct{}{}
	if extra {
		h.extra++
	}
	return true
}

// earlyPlaces yields the places of the pulls unpacking without their
// slot. h.mu must be held.
func (h *Handback) earlyPlaces(yield func(time.Time) bool) {
	for e := range h.early {
		if !yield(e.place()) {
			return
		}
	}
}

// Fetched is called when every blob of the pull is in; release gives its
// slot back, now or when an earlier pull is done unpacking. It does not
// block.
func (t *Turn) Fetched(release func()) {
	if t == nil {
		release()
		return
	}
	h := t.h
	h.mu.Lock()
	if t.state != turnActive {
		h.mu.Unlock()
		return
	}
	if h.goEarly(t) {
		h.mu.Unlock()
		release()
		return
	}
	t.state, t.release = turnHeld, release
	h.held = append(h.held, t)
	h.mu.Unlock()
}

// Done ends the turn. A pull that gave its slot back early lets the oldest
// held one give back its own. The caller still releases its own slot as
// usual (release is idempotent).
func (t *Turn) Done() {
	if t == nil {
		return
	}
	h := t.h
	h.mu.Lock()
	var next []func()
	switch t.state {
	case turnEarly:
		delete(h.early, t)
		if t.extra {
			h.extra--
		}
		// The oldest held pulls that may now go without their slot.
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
	case turnHeld:
		for i, n := range h.held {
			if n == t {
				h.held = append(h.held[:i], h.held[i+1:]...)
				break
			}
		}
	}
	t.state, t.release = turnDone, nil
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
