package lane

import (
	"context"
	"time"
)

// Pacer holds back the writing of a layer while a layer of a pull due
// well before it is being written in the same lane, so that the CPUs go to
// the pull that would finish first.
//
// Places alone cannot do that: a place is held to the end of a layer, and
// the extra places of an Overtaking lane let a small pull's layers start,
// not finish. Once started, they share the CPUs with a large image's
// layers, and under kubelet with the runtime starting pods too, so small
// images take several times longer to unpack than alone
// (BenchmarkKubeletCorpusBigAndSmall/loopback measures it). The operating
// system shares CPUs by thread, and a layer is written by one goroutine
// among containerd's, so its scheduler cannot be told; the layer's reader
// can. Only work holding a place counts, never work waiting for one: work
// ahead runs, so no pause waits on a pause; and a pull others wait for
// (Applier.Waited) is not paced.
type Pacer struct {
	lane   *Lane
	mine   *holder
	waited func(*Ticket) bool // Applier.Waited, or nil
	asked  every              // Wait's; only the reader
	paused time.Duration      // in all; only the reader
}

type pacerKey struct{}

// withPacer gives ctx's layer the pacer of its place h in l; a lane
// without slack paces nothing.
func withPacer(ctx context.Context, l *Lane, h *holder, waited func(*Ticket) bool) (context.Context, *Pacer) {
	if l.slack == 0 || h == nil {
		return ctx, nil
	}
	p := &Pacer{lane: l, mine: h, waited: waited}
	return context.WithValue(ctx, pacerKey{}, p), p
}

// PacerOf returns the pacer of the layer ctx applies (Applier), or nil.
func PacerOf(ctx context.Context) *Pacer {
	p, _ := ctx.Value(pacerKey{}).(*Pacer)
	return p
}

// Wait returns once no layer of a pull due more than the lane's slack
// before this one's holds a place, or when ctx ends. It asks at most every
// poll, so a reader may call it before every Read. A nil Pacer never
// waits.
func (p *Pacer) Wait(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if !p.asked.due() || !p.behind() {
		return nil
	}
	start := time.Now()
	defer func() { p.paused += time.Since(start) }()
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

// behind reports whether a holder of the lane is Ahead of p's place, and
// no one waits for p's pull. The lane is asked first: it is the cheaper
// question, and most of the time the answer is no.
func (p *Pacer) behind() bool {
	if !p.ahead() {
		return false
	}
	return p.waited == nil || !p.waited(p.mine.ticket)
}

// ahead reports whether a holder of the lane is Ahead of p's place.
func (p *Pacer) ahead() bool {
	l := p.lane
	mine := p.mine.place()
	l.mu.Lock()
	defer l.mu.Unlock()
	for h := range l.holders {
		if Ahead(h.place(), mine, l.slack) {
			return true
		}
	}
	return false
}
