package peers

import (
	"context"

	"golang.org/x/time/rate"
)

// chunk is how many bytes a server sends per write, and so per wait on
// the upload limit.
const chunk = 32 << 10

// throttle is the upload limit, one for all streams a node serves, so
// that the total it uploads stays under the cap however many peers ask.
type throttle struct {
	lim *rate.Limiter // nil: no limit
}

func newThrottle(bytesPerSec int64) *throttle {
	if bytesPerSec <= 0 {
		return &throttle{}
	}
	// A burst of one chunk: a limit below a chunk a second still lets
	// every chunk through, one at a time.
	return &throttle{lim: rate.NewLimiter(rate.Limit(bytesPerSec), chunk)}
}

// wait blocks until n bytes (at most chunk) may be sent.
func (t *throttle) wait(ctx context.Context, n int) error {
	if t.lim == nil {
		return nil
	}
	return t.lim.WaitN(ctx, n)
}
