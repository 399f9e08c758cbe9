// Package await is the tests' one way to wait for a condition they cannot
// be told about directly, such as a goroutine having joined a queue or a
// daemon having caught up: poll it, against a deadline, so that a test
// whose condition never comes fails, saying what it waited for, instead of
// hanging until the test binary's own timeout.
package await

import (
	"testing"
	"time"
)

// maxPause is the longest pause between two checks. The first pause is a
// millisecond and each one after doubles, up to this: a condition that
// holds a moment later is seen at once, and one that asks a daemon is not
// asked more than fifty times a second.
const maxPause = 20 * time.Millisecond

// Within polls cond until it holds or timeout has passed, and reports
// whether it held. cond is checked once more at the deadline, so a
// condition that holds by then counts. It is for callers whose failure
// says more than what they waited for (the last value seen, a log), or
// who do not fail at all; others call Until.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for !cond() {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		time.Sleep(min(pause, left))
		pause = min(2*pause, maxPause)
	}
	return true
}

// Until polls cond until it holds, and fails the test with t.Fatalf,
// naming what, once timeout has passed without it. Like t.Fatalf it must
// be called from the goroutine running the test.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}
