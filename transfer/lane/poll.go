package lane

import (
	"context"
	"time"
)

// Poll is how often paused work looks again, and how often work that runs
// on asks whether to pause: a question that takes a lane's lock and walks
// its holders, asked before every Read of a body or a layer, would be
// asked thousands of times a second; a Poll is well within the second
// of slack a pause needs.
const Poll = 20 * time.Millisecond

// every lets one reader ask a question at most every Poll.
type every struct{ last time.Time }

// due reports whether Poll has passed since it last said so.
func (e *every) due() bool {
	now := time.Now()
	if now.Sub(e.last) < Poll {
		return false
	}
	e.last = now
	return true
}

// waitWhile waits while cond holds, looking every Poll, until end fires
// (nil: never) or ctx ends. It reports whether cond still held.
func waitWhile(ctx context.Context, cond func() bool, end <-chan time.Time) (still bool, err error) {
	t := time.NewTicker(Poll)
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
