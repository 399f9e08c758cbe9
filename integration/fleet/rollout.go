package fleet

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Mode is how a rollout's nodes start their pulls.
type Mode string

const (
	// Simultaneous: every node asks at the same instant, as when a
	// Deployment lands on N nodes at once.
	Simultaneous Mode = "simultaneous"
	// Staggered: each node asks once the one before it has its image, as
	// in a rolling update one node at a time.
	Staggered Mode = "staggered"
)

// Modes are both modes, in the order the benchmark runs them.
var Modes = []Mode{Simultaneous, Staggered}

// Rollout has every node pull ref through CRI, started as mode says,
// and returns each node's pull time (from its own request to its
// answer), by node, and every pull's error.
func Rollout(ctx context.Context, nodes []*Node, ref string, mode Mode) ([]time.Duration, error) {
	took := make([]time.Duration, len(nodes))
	errs := make([]error, len(nodes))
	pull := func(i int) {
		start := time.Now()
		errs[i] = nodes[i].Pull(ctx, ref)
		took[i] = time.Since(start)
	}
	if mode == Staggered {
		for i := range nodes {
			pull(i)
		}
		return took, errors.Join(errs...)
	}
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i := range nodes {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			pull(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return took, errors.Join(errs...)
}

// Spread is the first, median and last of a rollout's pull times.
func Spread(took []time.Duration) (first, median, last time.Duration) {
	s := slices.Sorted(slices.Values(took))
	return s[0], s[len(s)/2], s[len(s)-1]
}
