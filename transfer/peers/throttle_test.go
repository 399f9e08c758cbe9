package peers

import (
	"context"
	"testing"
	"time"
)

// TestThrottleRate measures the upload limit in virtual time, through
// the reservations wait makes in real time: sending total bytes in chunks
// takes (total - one chunk of burst) / rate.
func TestThrottleRate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  int64
		total int
	}{
		{"1 MiB at 256 KiB/s", 256 << 10, 1 << 20},
		{"a rate below a chunk a second", 8 << 10, 4 * chunk},
		{"10 MiB at 100 MiB/s", 100 << 20, 10 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := newThrottle(tc.rate).lim
			start := time.Unix(0, 0)
			now := start
			for sent := 0; sent < tc.total; sent += chunk {
				r := lim.ReserveN(now, chunk)
				if !r.OK() {
					t.Fatal("a chunk is over the burst")
				}
				now = now.Add(r.DelayFrom(now))
			}
			want := time.Duration(float64(tc.total-chunk) / float64(tc.rate) * float64(time.Second))
			if got := now.Sub(start); got < want-time.Millisecond || got > want+time.Millisecond {
				t.Fatalf("took %s of virtual time, want %s", got, want)
			}
		})
	}
}

func TestThrottleUnlimited(t *testing.T) {
	th := newThrottle(0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a wait that slept would fail on it
	for range 100 {
		if err := th.wait(ctx, chunk); err != nil {
			t.Fatal(err)
		}
	}
}

func TestThrottleEndsWithTheContext(t *testing.T) {
	th := newThrottle(1)
	th.wait(context.Background(), chunk) // the burst
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := th.wait(ctx, chunk); err == nil {
		t.Fatal("a wait of hours returned nil on a cancelled context")
	}
}
