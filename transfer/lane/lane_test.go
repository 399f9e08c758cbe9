package lane

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestOldestPullFirst: with the lane full, waiters are served by ticket,
// not by arrival.
func TestOldestPullFirst(t *testing.T) {
	l := New(1)
	hold, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now()
	// Arrive youngest first.
	arrivals := []time.Duration{5, 3, 4, 1, 2}
	var (
		mu    sync.Mutex
		order []time.Duration
		wg    sync.WaitGroup
	)
	for i, age := range arrivals {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, err := l.Acquire(WithTicket(context.Background(), base.Add(age*time.Second)))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, age)
			mu.Unlock()
			release()
		}()
		// Each in line before the next arrives.
		for l.Waiting() != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	hold()
	wg.Wait()
	want := []time.Duration{1, 2, 3, 4, 5}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("served %v, want %v", order, want)
		}
	}
}

func TestCancelWhileWaiting(t *testing.T) {
	l := New(1)
	hold, _ := l.Acquire(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error)
	go func() {
		_, err := l.Acquire(ctx)
		errs <- err
	}()
	for l.Waiting() != 1 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter got %v", err)
	}
	if l.Waiting() != 0 {
		t.Fatal("cancelled waiter still in line")
	}
	hold()
	// The place is free again: no leak.
	release, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	release()
}

func TestUnlimited(t *testing.T) {
	l := New(0)
	for range 100 {
		if _, err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestConcurrentUse: never more than the limit at once, nothing lost when
// callers give up at random.
func TestConcurrentUse(t *testing.T) {
	l := New(3)
	var (
		mu      sync.Mutex
		in, top int
		wg      sync.WaitGroup
	)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*time.Millisecond)
			defer cancel()
			release, err := l.Acquire(WithTicket(ctx, time.Unix(int64(i%17), 0)))
			if err != nil {
				return
			}
			mu.Lock()
			in++
			top = max(top, in)
			mu.Unlock()
			time.Sleep(100 * time.Microsecond)
			mu.Lock()
			in--
			mu.Unlock()
			release()
		}()
	}
	wg.Wait()
	if top > 3 {
		t.Fatalf("%d at once with a limit of 3", top)
	}
	if l.Waiting() != 0 || l.running != 0 {
		t.Fatalf("left: %d waiting, %d running", l.Waiting(), l.running)
	}
}
