package hostclient

import (
	"sync"
	"time"
)

// place is the download place of one blob request (max_concurrent_downloads).
// It is given back when the body is closed, or earlier: once the rest of
// the body will arrive within one round trip at the rate it is arriving.
// The next request's round trip then overlaps this body's tail instead of
// following it. Without that, every blob costs its place one idle round
// trip, which on a link with latency leaves a share of it unused
// (BenchmarkDownloadsOverWAN measures it). Only bodies in their last round trip
// overlap, so the bodies transferring at full rate stay within the limit.
// On a link without latency the overlap is nil.
type place struct {
	mu      sync.Mutex
	release func() // nil while not held
	closed  bool   // the body is closed: a place taken again goes back at once

	// Set when the response headers arrive; read and advanced only by the
	// body's reader.
	rtt   time.Duration // request sent to headers
	size  int64         // body length; <= 0 unknown
	read  int64
	start time.Time // the first Read's return, from when the rate is measured
	since int64     // bytes read since start
}

func newPlace(release func()) *place {
	return &place{release: release}
}

// answered records the round trip, when the headers arrive with a body of
// size bytes (-1 unknown).
func (p *place) answered(rtt time.Duration, size int64) {
	if p == nil {
		return
	}
	p.rtt, p.size = rtt, size
}

// advance counts n more bytes of the body and gives the place back when
// what is left is due within one round trip.
func (p *place) advance(n int) {
	p.read += int64(n)
	if p.size <= 0 {
		return
	}
	left := p.size - p.read
	if left <= 0 {
		p.give()
		return
	}
	// The first Read returns what came with the headers, at no measurable
	// rate; the rate is measured from there, over at least a round trip,
	// so a burst cannot pass for a fast link.
	if p.start.IsZero() {
		p.start = time.Now()
		return
	}
	p.since += int64(n)
	elapsed := time.Since(p.start)
	// left / rate <= rtt, with rate = since / elapsed, without dividing.
	if elapsed >= p.rtt && float64(left)*elapsed.Seconds() <= p.rtt.Seconds()*float64(p.since) {
		p.give()
	}
}

// give returns the place; it is safe to call more than once, from Close
// while a Read runs, and on no place.
func (p *place) give() {
	if p == nil {
		return
	}
	p.mu.Lock()
	release := p.release
	p.release = nil
	p.mu.Unlock()
	if release != nil {
		release()
	}
}

// held reports whether the place is still held.
func (p *place) held() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.release != nil
}

// retake holds the place again with release, from a new lane place, after
// give; the rate is measured afresh. Only the body's reader calls it.
func (p *place) retake(release func()) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		release()
		return
	}
	p.release = release
	p.mu.Unlock()
	p.start, p.since = time.Time{}, 0
}

// close gives the place back for good: the body is closed.
func (p *place) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.give()
}
