package health

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Turn gives a request its turn at k, or tells it to wait. A host that
// answered 429 is asked again only when its Retry-After says (or, without
// one, after a back-off of its 429 streak), and then by one request at a
// time, since a host still throttling would answer every waiting request
// 429: concurrent pulls share one wait and one retry.
//
// With its turn, a request gets answered, to call once with how it went.
// Otherwise wait blocks until a turn may be free (a Retry-After ending, a
// retry answered) and the request asks again; a caller holding anything
// others need, such as a download place, gives it back first. first is when
// this request first asked: a request waits MaxRetryWait at the most, and
// a wait that would end later fails at once with a *ThrottledError.
func (t *Table) Turn(k Key, first time.Time) (answered func(o Outcome, retryAfter time.Duration), wait func(context.Context) error, err error) {
	if t == nil || t.cfg.MaxRetryWait <= 0 {
		return func(Outcome, time.Duration) {}, nil, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	h := t.get(k, now)
	switch {
	case h.retryProbe != nil:
		if now.Sub(first) >= t.cfg.MaxRetryWait {
			return nil, nil, t.throttled(k, h, now)
		}
		probed := h.retryProbe
		return nil, func(ctx context.Context) error {
			return sleep(ctx, probed, first.Add(t.cfg.MaxRetryWait).Sub(now))
		}, nil
	case now.Before(h.retryAt):
		if h.askedAt.Sub(first) > t.cfg.MaxRetryWait {
			return nil, nil, t.throttled(k, h, now)
		}
		d := h.retryAt.Sub(now)
		return nil, func(ctx context.Context) error { return sleep(ctx, nil, d) }, nil
	case !h.retryAt.IsZero():
		// The wait is over: this request tries the host.
		probe := make(chan struct{})
		h.retryProbe = probe
		return t.answered(k, probe), nil, nil
	}
	return t.answered(k, nil), nil, nil
}

// throttled counts a request not sent and says why; t.mu is held.
func (t *Table) throttled(k Key, h *host, now time.Time) error {
	h.requests[Skipped]++
	return &ThrottledError{Host: k.Host, Wait: max(h.askedAt.Sub(now), 0), Max: t.cfg.MaxRetryWait}
}

// sleep waits for d, or until woken is closed (nil: never), or ctx ends.
func sleep(ctx context.Context, woken <-chan struct{}, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-woken:
	case <-timer.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// answered returns the func that tells the table how a request that had
// its turn went; probe is set for the request that tries a host after its
// wait.
func (t *Table) answered(k Key, probe chan struct{}) func(Outcome, time.Duration) {
	var once sync.Once
	return func(o Outcome, retryAfter time.Duration) {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			now := t.now()
			h := t.get(k, now)
			switch {
			case o == Throttled:
				asked := now.Add(max(retryAfter, throttleBackoff(h.throttled)))
				h.askedAt = later(h.askedAt, asked)
				// A host asking for hours (a pull limit) is tried again
				// by one request after the longest cooldown, rather than
				// shut out until the daemon restarts: the limit may have
				// been on a repository or credentials, not the host.
				h.retryAt = later(h.retryAt, earlier(asked, now.Add(max(t.cfg.MaxCooldown, t.cfg.MaxRetryWait))))
			case o == Canceled || o == Skipped:
				// Nothing learned: the next request tries the host.
			case probe != nil:
				h.retryAt, h.askedAt = time.Time{}, time.Time{}
			}
			if probe != nil {
				h.retryProbe = nil
				close(probe)
			}
		})
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// throttleBackoff is the wait after the n-th 429 in a row that named none,
// where containerd would repeat the request at once: firstThrottleBackoff,
// doubling to maxThrottleBackoff.
func throttleBackoff(n int) time.Duration {
	return min(firstThrottleBackoff<<min(max(n-1, 0), 4), maxThrottleBackoff)
}

// The back-off after a 429 without Retry-After stays short, since the
// registry asked for no wait, and five 429s in a row mark the host failed
// anyway: a quarter second is about the time a registry's per-second
// token bucket takes to refill a request, and four doublings reach the
// cap by the fifth 429.
const (
	firstThrottleBackoff = 250 * time.Millisecond
	maxThrottleBackoff   = 2 * time.Second
)

// ThrottledError is a request not sent because its host asked for a wait
// longer than the node allows.
type ThrottledError struct {
	Host string
	// Wait is what is left of the wait the host asked for.
	Wait, Max time.Duration
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("not tried: 429 Too Many Requests, asked to wait %s, longer than the node waits (%s)",
		e.Wait.Round(time.Second), e.Max)
}
