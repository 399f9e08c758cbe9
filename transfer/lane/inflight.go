package lane

import (
	"context"
	"sync"
	"time"
)

// InFlight is the set of pulls the node runs, those past the gate, and
// makes the work of one give way to another Ahead of it while tasks on the
// node wait for a CPU.
//
// The places and the link see only the pulls' own work. On a node where
// kubelet starts pods beside a burst of pulls, the runtime (runc, the
// shims, kubelet) and the registry's side of a loopback link want the same
// CPUs, and a large image's download and writers then slow a small one's
// pull, though none of its layers holds a place the large one waits for.
// The kernel's pressure stall information sees all of it: while tasks
// wait for a CPU, a pause of work behind hands the CPU to someone, and
// when none wait, work goes on, so no pause leaves a CPU idle.
type InFlight struct {
	cpu   *Pressure
	slack time.Duration

	mu    sync.Mutex
	pulls map[*Ticket]int // a pull may be added more than once
}

// NewInFlight returns an empty set where work gives way to pulls at least
// slack earlier while cpu is contended (nil: never, and nothing gives way).
func NewInFlight(cpu *Pressure, slack time.Duration) *InFlight {
	return &InFlight{cpu: cpu, slack: slack, pulls: map[*Ticket]int{}}
}

// Add counts t's pull in flight until done is called, exactly once. A nil
// InFlight counts nothing.
func (f *InFlight) Add(t *Ticket) (done func()) {
	if f == nil || t == nil {
		return func() {}
	}
	f.mu.Lock()
	f.pulls[t]++
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.pulls[t]--; f.pulls[t] <= 0 {
			delete(f.pulls, t)
		}
	}
}

// Behind reports whether work of the pull with ticket t, due at mine,
// gives way: it is not late, a pull in flight is Ahead of it by the slack, and
// tasks wait for a CPU. The pressure is read last, and only when a pull
// is ahead.
func (f *InFlight) Behind(t *Ticket, mine time.Time) bool {
	if f == nil || f.cpu == nil {
		return false
	}
	return f.Ahead(t, mine) && f.cpu.Contended()
}

// Ahead reports whether the pull with ticket t, due at mine, is not late
// and another pull in flight is Ahead of it by the slack, by that pull's
// own due (Ticket.OwnDue).
func (f *InFlight) Ahead(t *Ticket, mine time.Time) bool {
	if f == nil || t == nil || t.Late(time.Now()) {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for o := range f.pulls {
		if o != t && Ahead(o.OwnDue(), mine, f.slack) {
			return true
		}
	}
	return false
}

// Yield waits while a pull in flight is Ahead of ctx's (TicketOf),
// looking every poll. It is for work that only moves earlier what would
// otherwise run after (transfer/early writes a layer before its last
// byte): such work takes nothing from the pulls ahead, whatever the
// pressure. A late pull, and work without a ticket, do not wait.
func (f *InFlight) Yield(ctx context.Context) error {
	t := TicketOf(ctx)
	if f == nil || t == nil || !f.Ahead(t, t.Due()) {
		return nil
	}
	start := time.Now()
	_, err := waitWhile(ctx, func() bool { return f.Ahead(t, t.Due()) }, nil)
	t.Waited(WaitEarly, time.Since(start))
	return err
}
