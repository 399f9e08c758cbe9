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
// places leave a CPU for this one, so it goes on. A late pull gives way to
// nobody, and a pull others wait on is as early as they are (Ticket.Due).
type Pacer struct {
	lane   *Lane
	mine   *holder
	asked  every         // Wait's; only the reader
	paused time.Duration // in all; only the reader
	// pausing is set while Wait holds the layer back, for tests that must
	// not let the work ahead end before the layer has paused.
	pausing atomic.Bool

	// For Progress, all the reader's: what the layer was priced at and
	// its compressed size, when its writing started, the first report,
	// and how far Progress has moved the pull's due.
	cost     time.Duration
	size     int64
	started  time.Time
	reported every
	first    mark
	repriced time.Duration
	now      func() time.Time // time.Now; tests set it
}

// mark is where a layer's writing stood at its first Progress report.
type mark struct {
	at     time.Time
	paused time.Duration
	done   float64 // the share of the layer written
}

type pacerKey struct{}

// withPacer gives ctx's layer the pacer of its place h in l, for a layer
// of size compressed bytes priced at cost; a lane without overtaking
// paces nothing.
func withPacer(ctx context.Context, l *Lane, h *holder, size int64, cost time.Duration) (context.Context, *Pacer) {
	if l.extra.slack == 0 || h == nil {
		return ctx, nil
	}
	p := &Pacer{lane: l, mine: h, size: size, cost: cost, now: time.Now}
	p.started = p.now()
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

// Size is the layer's compressed size, which a reader that counts the
// compressed bytes it has inflated reports its Progress against.
func (p *Pacer) Size() int64 {
	if p == nil {
		return 0
	}
	return p.size
}

// Progress tells the pacer how far the layer's writing has come: done of
// total bytes, in whatever the reader counts (the tar stream, or the
// compressed blob: Size). It re-prices the layer's pull by the layer's own
// pace, at most every poll: the time written so far, plus the rest at the
// pace since the first report, against what Costs priced the layer at.
//
// Why: a kind's rate prices a layer by its compressed bytes, and what a
// byte costs to write is set by what the layer holds (two zstd layers of
// 22 MiB have taken 0.5 and 4.7 s). Re-priced, a layer found dear lets the
// pulls it was wrongly placed before go first (its pull is due later, so
// theirs are ahead of it), and one found cheap stops giving way to them.
func (p *Pacer) Progress(done, total int64) {
	if p == nil || total <= 0 || !p.reported.due() {
		return
	}
	now, f := p.now(), min(float64(done)/float64(total), 1)
	if p.first.at.IsZero() {
		p.first = mark{at: now, paused: p.paused, done: f}
		return
	}
	ran := now.Sub(p.first.at) - (p.paused - p.first.paused)
	if ran < repriceAfter || f <= p.first.done {
		return
	}
	rest := time.Duration(float64(ran) * (1 - f) / (f - p.first.done))
	more := now.Sub(p.started) - p.paused + rest - p.cost
	p.mine.ticket.Reprice(more - p.repriced)
	p.repriced = more
}

// Repriced is how much later (earlier, when negative) Progress has moved
// the layer's pull.
func (p *Pacer) Repriced() time.Duration {
	if p == nil {
		return 0
	}
	return p.repriced
}

// repriceAfter is how long a layer is written, from its first report,
// before its pace re-prices its pull: a layer's first files say little
// of the rest (a few large files, or many small ones), while 100 ms is
// still a small part of a layer that was priced several times too cheap.
const repriceAfter = 100 * time.Millisecond

// Paused is how long Wait held the layer back in all.
func (p *Pacer) Paused() time.Duration {
	if p == nil {
		return 0
	}
	return p.paused
}

// behind reports whether p's layer gives way: it is not late, and at
// least as many layers ahead of it hold places as the lane has, or a pull
// ahead of it is in flight while tasks wait for a CPU (InFlight).
func (p *Pacer) behind() bool {
	if p.mine.ticket.Late(time.Now()) {
		return false
	}
	l := p.lane
	mine := p.mine.due()
	l.mu.Lock()
	ahead := 0
	for h := range l.holders {
		if Ahead(h.due(), mine, l.extra.slack) {
			ahead++
		}
	}
	l.mu.Unlock()
	return ahead >= l.limit || l.inflight.Behind(p.mine.ticket, mine)
}
