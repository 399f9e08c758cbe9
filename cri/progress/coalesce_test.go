package progress

import (
	"testing"
	"time"

	"github.com/pullwise/pullwise/transfer/hub"
)

func TestCoalescer(t *testing.T) {
	c := newCoalescer(250 * time.Millisecond)
	t0 := time.Unix(0, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := func(p int64) hub.Event { return hub.Event{Image: "i", Layer: "sha256:a", Progress: p, Total: 100} }

	c.add([]hub.Event{l(0)}, at(0))
	if got := c.due(at(0)); len(got) != 1 {
		t.Fatalf("first line held: %v", got)
	}
	// The layer starts moving 50ms later: a new phase goes out at once.
	c.add([]hub.Event{l(10)}, at(50))
	if got := c.due(at(50)); len(got) != 1 || got[0].Progress != 10 {
		t.Fatalf("start of download held: %v", got)
	}
	// Moving along: held until the interval has passed, latest wins.
	c.add([]hub.Event{l(20)}, at(100))
	c.add([]hub.Event{l(30)}, at(150))
	if got := c.due(at(150)); len(got) != 0 {
		t.Fatalf("sent within the interval: %v", got)
	}
	if next, ok := c.next(); !ok || !next.Equal(at(300)) {
		t.Fatalf("next due %v %v, want 300ms", next, ok)
	}
	if got := c.due(at(300)); len(got) != 1 || got[0].Progress != 30 {
		t.Fatalf("due at 300ms: %v", got)
	}
	// Completion is news.
	c.add([]hub.Event{l(100)}, at(310))
	if got := c.due(at(310)); len(got) != 1 || got[0].Progress != 100 {
		t.Fatalf("completion held: %v", got)
	}
	if _, ok := c.next(); ok {
		t.Fatal("nothing is held, yet a next time")
	}
}
