package health

import (
	"context"
	"errors"
	"testing"
	"time"
)

// turn asks for a turn at k that must be given at once, and returns its
// answer func.
func turn(t *testing.T, tb *Table, k Key, first time.Time) func(Outcome, time.Duration) {
	t.Helper()
	answered, wait, err := tb.Turn(k, first)
	if err != nil || wait != nil {
		t.Fatalf("Turn: %v (wait %v), want a turn at once", err, wait != nil)
	}
	return answered
}

// waiting asks for a turn at k in the background, waiting as told, and
// answers OK once it has it; the result arrives on the channel.
func waiting(tb *Table, k Key, first time.Time) <-chan error {
	done := make(chan error, 1)
	go func() {
		for {
			answered, wait, err := tb.Turn(k, first)
			switch {
			case err != nil:
				done <- err
				return
			case answered != nil:
				answered(OK, 0)
				done <- nil
				return
			}
			if err := wait(ctx); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

// throttle makes one request to k that the host answers 429 with
// retryAfter, as the transport reports it.
func throttle(t *testing.T, tb *Table, k Key, first time.Time, retryAfter time.Duration) {
	t.Helper()
	answered := turn(t, tb, k, first)
	r, _ := tb.Admit(k, true)
	r.Report(ctx, Throttled, "429 Too Many Requests")
	answered(Throttled, retryAfter)
}

func TestThrottleWait(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxCooldown time.Duration
		retryAfter  time.Duration // of the 429
		streak      int           // 429s in a row before it, with no Retry-After
		want        time.Duration // when the host may be asked again
		refused     bool          // longer than MaxRetryWait: not waited
		probeAfter  time.Duration // when refused: when one request tries anyway
	}{
		{name: "Retry-After honoured", retryAfter: 3 * time.Second, want: 3 * time.Second},
		{name: "no Retry-After: back-off of the streak", want: 250 * time.Millisecond},
		{name: "third in a row", streak: 2, want: time.Second},
		{name: "ninth in a row: the back-off stops growing", streak: 8, want: 2 * time.Second},
		{name: "Retry-After over the streak", streak: 2, retryAfter: 5 * time.Second, want: 5 * time.Second},
		{name: "longer than the node waits", retryAfter: 2 * time.Minute, want: 2 * time.Minute, refused: true, probeAfter: 30 * time.Second},
		{name: "hours: tried after the longest cooldown", maxCooldown: 5 * time.Minute, retryAfter: 6 * time.Hour,
			want: 6 * time.Hour, refused: true, probeAfter: 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, clk := newTable(Config{MaxRetryWait: 30 * time.Second, ThrottleLimit: 5, MaxCooldown: tc.maxCooldown})
			for range tc.streak {
				r, _ := tb.Admit(upstream, true)
				r.Report(ctx, Throttled, "429")
			}
			throttle(t, tb, upstream, clk.now(), tc.retryAfter)

			if !tc.refused {
				if got := status(t, tb, upstream).RetryAt.Sub(clk.now()); got != tc.want {
					t.Fatalf("RetryAt in %s, want %s", got, tc.want)
				}
				// Past the wait, the request goes, and once it got through
				// the host is asked at once. (The table's clock is not the
				// timers': a request before it would wait for ever.)
				clk.advance(tc.want)
				turn(t, tb, upstream, clk.now())(OK, 0)
				turn(t, tb, upstream, clk.now())(OK, 0)
				if got := status(t, tb, upstream).RetryAt; !got.IsZero() {
					t.Fatalf("RetryAt %s after the host answered", got)
				}
				return
			}
			_, _, err := tb.Turn(upstream, clk.now())
			var throttled *ThrottledError
			if !errors.As(err, &throttled) || throttled.Wait != tc.want || throttled.Host != upstream.Host {
				t.Fatalf("Turn: %v, want a refusal naming %s and %s", err, upstream.Host, tc.want)
			}
			// However long it asked for, one request tries the host again
			// after probeAfter: the daemon does not shut it out for good.
			clk.advance(tc.probeAfter)
			answered := turn(t, tb, upstream, clk.now())
			_, _, err = tb.Turn(upstream, clk.now().Add(-tc.probeAfter))
			if !errors.As(err, &throttled) {
				t.Fatalf("a request that has waited as long as the node waits, while the retry is out: %v, want a refusal", err)
			}
			answered(OK, 0)
			turn(t, tb, upstream, clk.now())(OK, 0)
		})
	}
}

// TestThrottleOneRetryForAll: after a wait, one request tries the host;
// the others wait for its answer, and follow it.
func TestThrottleOneRetryForAll(t *testing.T) {
	tb, clk := newTable(Config{MaxRetryWait: 30 * time.Second})
	throttle(t, tb, mirror, clk.now(), 5*time.Second)
	clk.advance(5 * time.Second)

	probe := turn(t, tb, mirror, clk.now())
	others := []<-chan error{waiting(tb, mirror, clk.now()), waiting(tb, mirror, clk.now()), waiting(tb, upstream, clk.now())}
	// Another host is not held by this one's wait.
	if err := <-others[2]; err != nil {
		t.Fatalf("upstream: %v", err)
	}
	select {
	case err := <-others[0]:
		t.Fatalf("a request went while the retry was out: %v", err)
	default:
	}
	// Still throttled, for longer than the node waits: the others fail at
	// once rather than send.
	probe(Throttled, time.Minute)
	for _, w := range others[:2] {
		var throttled *ThrottledError
		if err := <-w; !errors.As(err, &throttled) {
			t.Fatalf("waiting request: %v, want a ThrottledError", err)
		}
	}
	if n := status(t, tb, mirror).Requests[Skipped]; n != 2 {
		t.Fatalf("%d requests counted as skipped, want 2", n)
	}
}

// TestThrottleRetryGivesUp: a retry whose caller goes away leaves the next
// request to try the host; a waiting caller that goes away returns.
func TestThrottleRetryGivesUp(t *testing.T) {
	tb, clk := newTable(Config{MaxRetryWait: 30 * time.Second})
	throttle(t, tb, mirror, clk.now(), time.Second)
	clk.advance(time.Second)

	probe := turn(t, tb, mirror, clk.now())
	next := waiting(tb, mirror, clk.now())
	_, wait, err := tb.Turn(mirror, clk.now())
	if err != nil || wait == nil {
		t.Fatalf("Turn while the retry is out: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := wait(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	probe(Canceled, 0)
	if err := <-next; err != nil {
		t.Fatalf("the request after a cancelled retry: %v", err)
	}
	if got := status(t, tb, mirror).RetryAt; !got.IsZero() {
		t.Fatalf("RetryAt %s after the next request got through", got)
	}
}

func TestThrottleOff(t *testing.T) {
	tb, clk := newTable(Config{})
	answered, _, _ := tb.Turn(mirror, clk.now())
	answered(Throttled, time.Hour)
	if answered, wait, err := tb.Turn(mirror, clk.now()); err != nil || wait != nil || answered == nil {
		t.Fatalf("with MaxRetryWait 0 requests go at once, as stock's: %v", err)
	}
	var nilTable *Table
	if answered, _, err := nilTable.Turn(mirror, clk.now()); err != nil || answered == nil {
		t.Fatal(err)
	}
}
