package lane

import (
	"time"
)

// Wait is what a pull's work waited for while other pulls' work went on.
// A pull's waits are summed by kind on its ticket (Ticket.Waited) and its
// timeline gives them at info level, so that a pull that came in late in
// a burst says where its time went without debug lines, whose cost to the
// daemon changes the burst they describe. Waits of work done in parallel
// (a pull's layers, its blobs) add up, so a sum can exceed the pull's own
// time.
type Wait int

const (
	WaitDownload Wait = iota // for a download place
	WaitLink                 // a body paused for pulls ahead (Link), and its place asked for again
	WaitLock                 // for another pull's lock on a blob or chain both hold (KeyedLock)
	WaitEarly                // an early write for pulls ahead before it asked for a place (InFlight.Yield)
	WaitUnpack               // for an unpack place
	WaitPace                 // a layer paused while written (Pacer)
	WaitWrite                // for its turn to write to the metadata database (transfer/commits)
	waitKinds
)

// waitNames are the timeline's field names, by Wait.
var waitNames = [waitKinds]string{
	WaitDownload: "waited_download",
	WaitLink:     "paused_link",
	WaitLock:     "waited_lock",
	WaitEarly:    "yielded_early",
	WaitUnpack:   "waited_unpack",
	WaitPace:     "paused_unpack",
	WaitWrite:    "waited_write",
}

// Waited adds d to t's waits of kind w; nothing for work without a
// ticket.
func (t *Ticket) Waited(w Wait, d time.Duration) {
	if t == nil || d <= 0 {
		return
	}
	t.waits[w].Add(int64(d))
}

// Waits yields t's waits that are not zero, by their timeline names.
func (t *Ticket) Waits(yield func(name string, d time.Duration) bool) {
	if t == nil {
		return
	}
	for w := range waitKinds {
		if d := time.Duration(t.waits[w].Load()); d > 0 && !yield(waitNames[w], d) {
			return
		}
	}
}
