package health

import (
	"context"
	"errors"
	"testing"
	"time"
)

// turn asks for a turn at k and returns its answer func, failing the test
// on an error.
func turn(t *testing.T, tb *Table, k Key) func(Outcome, time.Duration) {
	t.Helper()
	answered, err := tb.AwaitTurn(ctx, k)
	if err != nil {
		t.Fatalf("AwaitTurn: %v", err)
	}
	return answered
}

// waiting starts an AwaitTurn at k in the background; its result arrives on
// the returned channel.
func waiting(tb *Table, k Key) <-chan error {
	done := make(chan error, 1)
	go func() {
		answered, err := tb.AwaitTurn(ctx, k)
		if err == nil {
			answered(OK, 0)
		}
		done <- err
	}()
	return done
}

func TestThrottleWait(t *testing.T) {
	cfg := Config{MaxRetryWait: 30 * time.Second, ThrottleLimit: 5}
	for _, tc := range []struct {
		name       string
		retryAfter time.Duration // of the 429
		streak     int           // 429s in a row before it, with no Retry-After
		want       time.Duration // when the host may be asked again; 0: at once
		refused    bool          // longer than MaxRetryWait: not waited
	}{
		{name: "Retry-After honoured", retryAfter: 3 * time.Second, want: 3 * time.Second},
		{name: "no Retry-After: back-off of the streak", want: 250 * time.Millisecond},
		{name: "third in a row", streak: 2, want: time.Second},
		{name: "ninth in a row: the back-off stops growing", streak: 8, want: 2 * time.Second},
		{name: "Retry-After over the streak", streak: 2, retryAfter: 5 * time.Second, want: 5 * time.Second},
		{name: "longer than the node waits", retryAfter: 2 * time.Minute, want: 2 * time.Minute, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, clk := newTable(cfg)
			for range tc.streak {
				r, _ := tb.Admit(upstream, true)
				r.Report(ctx, Throttled, "429")
			}
			answered := turn(t, tb, upstream)
			r, _ := tb.Admit(upstream, true)
			r.Report(ctx, Throttled, "429 Too Many Requests")
			answered(Throttled, tc.retryAfter)

			if got := status(t, tb, upstream).RetryAt.Sub(clk.now()); got != tc.want {
				t.Fatalf("RetryAt in %s, want %s", got, tc.want)
			}
			if tc.refused {
				_, err := tb.AwaitTurn(ctx, upstream)
				var throttled *ThrottledError
				if !errors.As(err, &throttled) || throttled.Wait != tc.want || throttled.Host != upstream.Host {
					t.Fatalf("AwaitTurn: %v, want a refusal naming %s and %s", err, upstream.Host, tc.want)
				}
				return
			}
			// Past the wait, the request goes, and once it got through
			// the host is asked at once. (The table's clock is not the
			// timers': a request before it would wait for ever.)
			clk.advance(tc.want)
			turn(t, tb, upstream)(OK, 0)
			turn(t, tb, upstream)(OK, 0)
			if got := status(t, tb, upstream).RetryAt; !got.IsZero() {
				t.Fatalf("RetryAt %s after the host answered", got)
			}
		})
	}
}

// TestThrottleOneRetryForAll: after a wait, one request tries the host;
// the others wait for its answer, and follow it.
func TestThrottleOneRetryForAll(t *testing.T) {
	tb, clk := newTable(Config{MaxRetryWait: 30 * time.Second})
	turn(t, tb, mirror)(Throttled, 5*time.Second)
	clk.advance(5 * time.Second)

	probe := turn(t, tb, mirror)
	others := []<-chan error{waiting(tb, mirror), waiting(tb, mirror), waiting(tb, upstream)}
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
	turn(t, tb, mirror)(Throttled, time.Second)
	clk.advance(time.Second)

	probe := turn(t, tb, mirror)
	next := waiting(tb, mirror)
	cctx, cancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := tb.AwaitTurn(cctx, mirror)
		gone <- err
	}()
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
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
	tb, _ := newTable(Config{})
	turn(t, tb, mirror)(Throttled, time.Hour)
	if _, err := tb.AwaitTurn(ctx, mirror); err != nil {
		t.Fatalf("with MaxRetryWait 0 requests go at once, as stock's: %v", err)
	}
	var nilTable *Table
	if _, err := nilTable.AwaitTurn(ctx, mirror); err != nil {
		t.Fatal(err)
	}
}
