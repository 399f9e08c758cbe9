package lane

import (
	"context"
	"time"
)

// poll is how often paused work looks again, and how often work that runs
// on asks whether to pause: a question that takes a lane's lock and walks
// its holders, asked before every Read of a body or a layer, would be
// asked thousands of times a second; every poll is well within the second
// of slack a pause needs.
const poll = 20 * time.Millisecond

// every lets one reader ask a question at most every poll.
type every struct{ last time.Time }

// due reports whether poll has passed since it last said so.
func (e *every) due() bool {
	now := time.Now()
	if now.Sub(e.last) < poll {
		return false
	}
	e.last = now
	return true
}

// waitWhile waits while cond holds, looking every poll, until end fires
// (nil: never) or ctx ends. It reports whether cond still held.
func waitWhile(ctx context.Context, cond func() bool, end <-chan time.Time) (still bool, err error) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for cond() {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case <-end:
			return true, nil
		case <-t.C:
		}
	}
	return false, nil
}
