package lane_test

import (
	"fmt"
	"testing"

	"github.com/pullwise/pullwise/internal/lendtest"
	"github.com/pullwise/pullwise/transfer/lane"
)

// TestKeyedLockLends: while a pull waits on a key another holds, the
// holder is due no later than the waiter, and its work already in a lane
// moves up to that due; once the key changes hands, or the waiter gives
// up, the holder is due as before.
func TestKeyedLockLends(t *testing.T) {
	for _, giveUp := range []bool{false, true} {
		t.Run(fmt.Sprintf("waiter gives up=%v", giveUp), func(t *testing.T) {
			l := lane.New(1)
			lendtest.HolderGoesFirst(t, lane.NewKeyedLock(l), lendtest.Lane(l, 1), giveUp)
		})
	}
}
