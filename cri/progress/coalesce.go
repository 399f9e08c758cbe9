package progress

import (
	"time"

	"github.com/pullwise/pullwise/transfer/hub"
)

// coalescer holds back a stream's lines so that each layer (and each image
// line) is sent at most once per interval while it only moves along. A line
// that says something new (a layer starts moving, completes or fails) goes
// out at once: a watcher learns of a layer starting without waiting a full
// interval.
type coalescer struct {
	interval time.Duration
	held     map[string]hub.Event // latest unsent line per key
	order    []string
	sent     map[string]sentLine
}

type sentLine struct {
	at    time.Time
	phase int
}

func newCoalescer(interval time.Duration) *coalescer {
	return &coalescer{interval: interval, held: map[string]hub.Event{}, sent: map[string]sentLine{}}
}

func key(e hub.Event) string { return e.Image + "\x00" + e.Layer }

// phase tells the states a watcher must see as they happen.
func phase(e hub.Event) int {
	switch {
	case e.Error != "":
		return 3
	case e.Total > 0 && e.Progress >= e.Total:
		return 2
	case e.Progress > 0:
		return 1
	}
	return 0
}

func (c *coalescer) add(lines []hub.Event, now time.Time) {
	for _, l := range lines {
		k := key(l)
		if _, ok := c.held[k]; !ok {
			c.order = append(c.order, k)
		}
		c.held[k] = l
	}
}

// due returns the held lines that may go out at now, in arrival order.
func (c *coalescer) due(now time.Time) []hub.Event {
	var out []hub.Event
	kept := c.order[:0]
	for _, k := range c.order {
		l := c.held[k]
		last, seen := c.sent[k]
		if !seen || phase(l) != last.phase || now.Sub(last.at) >= c.interval {
			out = append(out, l)
			c.sent[k] = sentLine{at: now, phase: phase(l)}
			delete(c.held, k)
			continue
		}
		kept = append(kept, k)
	}
	c.order = kept
	return out
}

// flush returns every held line: the stream is ending.
func (c *coalescer) flush() []hub.Event {
	out := make([]hub.Event, 0, len(c.order))
	for _, k := range c.order {
		out = append(out, c.held[k])
	}
	clear(c.held)
	c.order = c.order[:0]
	return out
}

// next is when the earliest held line becomes due.
func (c *coalescer) next() (time.Time, bool) {
	var at time.Time
	for _, k := range c.order {
		t := c.sent[k].at.Add(c.interval)
		if at.IsZero() || t.Before(at) {
			at = t
		}
	}
	return at, !at.IsZero()
}
