package hub

import (
	"slices"
	"sync"
)

// Subscription receives the progress of the pulls its selector matches.
// It holds the latest line per layer (and per image) until read, so a
// reader that falls behind skips states rather than slowing pulls.
type Subscription struct {
	h   *Hub
	sel Selector

	mu      sync.Mutex
	pending map[string]Event // by pull key and layer
	order   []string         // keys of pending, in arrival order
	active  map[string]bool  // pulls matched and not done
	seen    bool             // a matching pull has been seen
	notify  chan struct{}    // capacity 1: something is pending
}

// Subscribe starts a subscription; its first lines are the current state
// of the matching pulls. Close it when done.
func (h *Hub) Subscribe(sel Selector) *Subscription {
	s := &Subscription{h: h, sel: sel, pending: map[string]Event{}, active: map[string]bool{}, notify: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[*Subscription]struct{}{}
	}
	h.subs[s] = struct{}{}
	for _, p := range h.pulls {
		if sel(p.info()) {
			s.offer(p.key, p.snapshotLocked(), p.done)
		}
	}
	return s
}

// Close stops the subscription.
func (s *Subscription) Close() {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	delete(s.h.subs, s)
}

// Ready is signalled when lines are pending.
func (s *Subscription) Ready() <-chan struct{} { return s.notify }

// offer queues events of pull key; called with the hub's lock held, so it
// only touches the subscription's own state and never blocks.
func (s *Subscription) offer(key string, events []Event, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = true
	if done {
		delete(s.active, key)
	} else {
		s.active[key] = true
	}
	for _, e := range events {
		k := key + "\x00" + e.Layer
		if _, ok := s.pending[k]; ok {
			// Keep lines in the order of their latest state, so an image's
			// final line comes after its layers'. Pending lines are few:
			// one per layer of the pulls in flight.
			s.order = slices.DeleteFunc(s.order, func(o string) bool { return o == k })
		}
		s.order = append(s.order, k)
		s.pending[k] = e
	}
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Take returns the pending lines, oldest first, and whether the
// subscription is over: it saw matching pulls and none is left in flight.
func (s *Subscription) Take() (lines []Event, over bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range s.order {
		lines = append(lines, s.pending[k])
	}
	clear(s.pending)
	s.order = s.order[:0]
	return lines, s.seen && len(s.active) == 0
}
