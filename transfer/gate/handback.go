package gate

import "sync"

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
type Handback struct {
	limit int

	mu    sync.Mutex
	early int     // pulls unpacking without their slot
	held  []*Turn // fetched pulls keeping their slot, oldest first
}

// NewHandback lets limit pulls at once unpack without their slot.
func NewHandback(limit int) *Handback {
	return &Handback{limit: max(limit, 1)}
}

// Turn is one pull's part in the hand back.
type Turn struct {
	h       *Handback
	state   turnState
	release func()
}

type turnState int

const (
	turnActive turnState = iota // downloading
	turnHeld                    // fetched, keeping its slot
	turnEarly                   // fetched, slot given back
	turnDone
)

// Start begins a pull's turn; call Done when the pull ends, however it
// ends. A nil Handback gives every slot back at once.
func (h *Handback) Start() *Turn {
	if h == nil {
		return nil
	}
	return &Turn{h: h}
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
	if h.early < h.limit {
		t.state = turnEarly
		h.early++
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
	var next func()
	switch t.state {
	case turnEarly:
		h.early--
		if len(h.held) > 0 {
			n := h.held[0]
			h.held = h.held[1:]
			n.state, next, n.release = turnEarly, n.release, nil
			h.early++
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
	if next != nil {
		next()
	}
}

// Held is how many fetched pulls keep their slot, for tests.
func (h *Handback) Held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}
