package lane

import (
	"context"
	"sync/atomic"
	"time"
)

// Pacer holds back the writing of a layer while layers of pulls ahead of
// it (Ahead) fill every place of its lane, so that the CPUs go to the
// pulls that would finish first.
//
// Places alone cannot do that: a place is held to the end of a layer, and
// the extra places of an Overtaking lane let a small pull's layers start,
// not finish. Once started, they share the CPUs with a large image's
// layers, and under kubelet with the runtime starting pods too, so small
// images take several times longer to unpack than alone
// (BenchmarkKubeletCorpusBigAndSmall measures it). The operating system
// shares CPUs by thread, and a layer is written by one goroutine among
// containerd's, so its scheduler cannot be told; the layer's reader can.
//
// Only work holding a place counts, never work waiting for one: work
// ahead runs, so no pause waits on a pause. Fewer layers ahead than
// places leave a CPU for this one, so it goes on, and so does a layer
// while work ahead of it waits for a place: its pause would keep the
// place that work waits for. A late pull gives way to nobody, and a pull
// others wait on is as early as they are (Ticket.Due). A layer written
// while its blob arrives gives way to any pull ahead in flight, CPUs
// contended or not (WrittenEarly): written after its last byte, as
// containerd would, it would have left them the node.
type Pacer struct {
	lane   *Lane
	mine   *holder
	early  bool          // WrittenEarly
	asked  every         // Wait's; only the reader
	paused time.Duration // in all; only the reader
	// pausing is set while Wait holds the layer back, for tests that must
	// not let the work ahead end before the layer has paused.
	pausing atomic.Bool
}

type pacerKey struct{}

// withPacer gives ctx's layer the pacer of its place h in l; a lane
// without overtaking paces nothing.
func withPacer(ctx context.Context, l *Lane, h *holder) (context.Context, *Pacer) {
	if l.extra.slack == 0 || h == nil {
		return ctx, nil
	}
	_, early := writtenEarly(ctx)
	p := &Pacer{lane: l, mine: h, early: early}
	return context.WithValue(ctx, pacerKey{}, p), p
}

// PacerOf returns the pacer of the layer ctx applies (Applier), or nil.
func PacerOf(ctx context.Context) *Pacer {
	p, _ := ctx.Value(pacerKey{}).(*Pacer)
	return p
}

// Wait returns once the layer need not give way, or when ctx ends. It
// asks at most every poll, so a reader may call it before every Read. A
// nil Pacer never waits.
func (p *Pacer) Wait(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if !p.asked.due() || !p.behind() {
		return nil
	}
	start := time.Now()
	p.pausing.Store(true)
	defer func() {
		p.pausing.Store(false)
		p.paused += time.Since(start)
	}()
	_, err := waitWhile(ctx, p.behind, nil)
	return err
}

// Paused is how long Wait held the layer back in all.
func (p *Pacer) Paused() time.Duration {
	if p == nil {
		return 0
	}
	return p.paused
}

// behind reports whether p's layer gives way: it is not late, no work
// ahead of it waits for a place, and at least as many layers ahead of it
// hold places as the lane has, or a pull ahead of it is in flight while
// tasks wait for a CPU (InFlight), or at all for a layer written early.
func (p *Pacer) behind() bool {
	if p.mine.ticket.Late(time.Now()) {
		return false
	}
	l := p.lane
	mine := p.mine.due()
	l.mu.Lock()
	if l.waiting.Len() > 0 && Ahead(l.waiting[0].due, mine, l.extra.slack) {
		// Work ahead waits for a place, and a pause keeps this one:
		// written on, the layer hands it over sooner.
		l.mu.Unlock()
		return false
	}
	ahead := 0
	for h := range l.holders {
		if Ahead(h.ownDue(), mine, l.extra.slack) {
			ahead++
		}
	}
	l.mu.Unlock()
	if ahead >= l.limit {
		return true
	}
	if p.early {
		return l.inflight.Ahead(p.mine.ticket, mine)
	}
	return l.inflight.Behind(p.mine.ticket, mine)
}
