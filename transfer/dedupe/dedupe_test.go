package dedupe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"

	"github.com/pullwise/pullwise/internal/await"
)

func TestConcurrentCallersShareOneRun(t *testing.T) {
	var (
		g       Group
		runs    atomic.Int32
		started = make(chan struct{})
		finish  = make(chan struct{})
		wg      sync.WaitGroup
		shared  atomic.Int32
	)
	boom := errors.New("same result for all")
	fn := func(ctx context.Context, _ func(transfer.Progress)) error {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-finish
		return boom
	}
	const callers = 20
	joined := make(chan struct{}, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			joined <- struct{}{}
			s, err := g.Do(context.Background(), "k", nil, fn)
			if !errors.Is(err, boom) {
				t.Errorf("caller got %v", err)
			}
			if s {
				shared.Add(1)
			}
		}()
	}
	<-started
	for range callers {
		<-joined
	}
	// Every caller must be inside Do before the run ends for all to share
	// it; wait until the run has all of them.
	waitCallers(t, &g, "k", callers)
	close(finish)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
	if shared.Load() != callers-1 {
		t.Fatalf("%d callers joined a shared run, want %d", shared.Load(), callers-1)
	}
	if n := len(g.calls); n != 0 {
		t.Fatalf("%d keys left in flight", n)
	}
}

// waitCallers waits until the run of key has n callers.
func waitCallers(t *testing.T, g *Group, key string, n int) {
	t.Helper()
	await.Until(t, 5*time.Second, fmt.Sprintf("the run of %s to have %d callers", key, n), func() bool {
		g.mu.Lock()
		c := g.calls[key]
		g.mu.Unlock()
		if c == nil {
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.callers) == n
	})
}

func TestRunCancelledOnlyWhenAllCallersLeave(t *testing.T) {
	var g Group
	runCancelled := make(chan struct{})
	fn := func(ctx context.Context, _ func(transfer.Progress)) error {
		<-ctx.Done()
		close(runCancelled)
		return ctx.Err()
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	ctxB, cancelB := context.WithCancel(context.Background())
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { _, err := g.Do(ctxA, "k", nil, fn); errA <- err }()
	waitCallers(t, &g, "k", 1)
	go func() { _, err := g.Do(ctxB, "k", nil, fn); errB <- err }()
	waitCallers(t, &g, "k", 2)

	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Fatalf("A got %v", err)
	}
	select {
	case <-runCancelled:
		t.Fatal("run cancelled while B still waits")
	default:
	}
	cancelB()
	if err := <-errB; !errors.Is(err, context.Canceled) {
		t.Fatalf("B got %v", err)
	}
	<-runCancelled
}

func TestDifferentKeysRunSeparately(t *testing.T) {
	var g Group
	var runs atomic.Int32
	fn := func(context.Context, func(transfer.Progress)) error { runs.Add(1); return nil }
	for _, k := range []string{"a", "b", "a"} {
		if _, err := g.Do(context.Background(), k, nil, fn); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("%d runs, want 3 (sequential calls never share)", runs.Load())
	}
}

func TestProgressReachesEveryCallerWithoutBlockingTheRun(t *testing.T) {
	var g Group
	release := make(chan struct{})
	var got1 []string
	var mu sync.Mutex
	stuckCalled := make(chan struct{}, 1)
	stuck := func(transfer.Progress) {
		select {
		case stuckCalled <- struct{}{}:
		default:
		}
		<-release // a progress func nobody reads, as CRI's with timeout 0s
	}
	collect := func(p transfer.Progress) {
		mu.Lock()
		got1 = append(got1, p.Event)
		mu.Unlock()
	}
	ready := make(chan struct{})
	fn := func(ctx context.Context, progress func(transfer.Progress)) error {
		<-ready
		for _, e := range []string{"waiting", "downloading", "complete"} {
			progress(transfer.Progress{Event: e, Name: "layer"})
		}
		return nil
	}
	ctxStuck, cancelStuck := context.WithCancel(context.Background())
	defer cancelStuck()
	done := make(chan error, 2)
	go func() { _, err := g.Do(ctxStuck, "k", stuck, fn); done <- err }()
	waitCallers(t, &g, "k", 1)
	go func() { _, err := g.Do(context.Background(), "k", collect, fn); done <- err }()
	waitCallers(t, &g, "k", 2)
	close(ready)
	<-stuckCalled
	// The collecting caller returns with all its events although the other
	// caller's progress func is stuck.
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(got1) != 3 || got1[2] != "complete" {
		t.Fatalf("collector got %v", got1)
	}
	mu.Unlock()
	cancelStuck() // CRI cancels its context after Transfer returns
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	close(release)
}
