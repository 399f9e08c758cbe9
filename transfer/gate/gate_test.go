package gate

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/transfer/lane"
)

func mustAcquire(t *testing.T, g *Gate) func() {
	t.Helper()
	release, _, err := g.Acquire(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	return release
}

func TestUnlimitedNeverWaits(t *testing.T) {
	g := New(0, 0)
	var releases []func()
	for range 100 {
		releases = append(releases, mustAcquire(t, g))
	}
	if g.Running() != 100 || g.Waiting() != 0 {
		t.Fatalf("running %d waiting %d", g.Running(), g.Waiting())
	}
	for _, r := range releases {
		r()
	}
	if g.Running() != 0 {
		t.Fatalf("running %d after all released", g.Running())
	}
}

func TestLimitHeld(t *testing.T) {
	const limit, pulls = 3, 12
	g := New(limit, 0)
	var (
		mu      sync.Mutex
		ran     int
		maxRun  int
		running int
		wg      sync.WaitGroup
	)
	held := make([]func(), limit)
	for i := range held {
		held[i] = mustAcquire(t, g)
	}
	proceed := make(chan struct{})
	for i := range pulls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, _, err := g.Acquire(context.Background(), false)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			ran++
			running++
			maxRun = max(maxRun, running)
			mu.Unlock()
			<-proceed
			mu.Lock()
			running--
			mu.Unlock()
			release()
		}()
		// Queue them one by one so the expected order is known.
		await.Until(t, 5*time.Second, "waiter to queue", func() bool { return g.Waiting() == i+1 })
	}
	for _, r := range held {
		r()
	}
	close(proceed)
	wg.Wait()
	if maxRun > limit {
		t.Fatalf("%d pulls held slots at once, limit %d", maxRun, limit)
	}
	if ran != pulls {
		t.Fatalf("%d pulls ran, want %d", ran, pulls)
	}
	if g.Running() != 0 || g.Waiting() != 0 {
		t.Fatalf("leftover: running %d waiting %d", g.Running(), g.Waiting())
	}
}

// waiting is a pull queued in TestTicketOrder.
type waiting struct {
	asked time.Duration // after the test's base time; -1: no ticket
	size  int64         // bytes, learned once queued; -1: never
}

func noTickets(n int) []waiting {
	w := make([]waiting, n)
	for i := range w {
		w[i] = waiting{-1, -1}
	}
	return w
}

// TestTicketOrder grants one slot at a time, so the grant order is exactly
// observable: waiters are served by their tickets' places, which move when
// a pull learns its size while it waits; equal places, and waiters without
// a ticket, keep arrival order.
func TestTicketOrder(t *testing.T) {
	base := time.Unix(1000, 0)
	const mib = 1 << 20
	for _, tc := range []struct {
		name    string
		waiters []waiting
		want    []int
	}{
		{"no tickets: arrival order", noTickets(10), []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{"no sizes: as asked",
			[]waiting{{0, -1}, {10 * time.Millisecond, -1}, {20 * time.Millisecond, -1}}, []int{0, 1, 2}},
		{"equal sizes: as asked",
			[]waiting{{0, 4 * mib}, {10 * time.Millisecond, 4 * mib}, {20 * time.Millisecond, 4 * mib}}, []int{0, 1, 2}},
		{"a small pull overtakes a large one asked just before",
			[]waiting{{0, 100 * mib}, {10 * time.Millisecond, mib}, {20 * time.Millisecond, -1}}, []int{1, 2, 0}},
		{"no pull is overtaken by one asked later than the difference allows",
			[]waiting{{0, 10 * mib}, {200 * time.Millisecond, 0}}, []int{0, 1}},
		{"one already on the node goes first",
			[]waiting{{0, 4 * mib}, {time.Millisecond, 0}}, []int{1, 0}},
		{"without a ticket: placed at arrival, behind every ticket asked before",
			[]waiting{{-1, -1}, {0, -1}}, []int{1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(1, 0)
			release := mustAcquire(t, g)
			granted := make(chan int, len(tc.waiters))
			releases := make(chan func(), len(tc.waiters))
			var tickets []*lane.Ticket
			for i, w := range tc.waiters {
				ctx := context.Background()
				var tk *lane.Ticket
				if w.asked >= 0 {
					tk = lane.NewTicket(base.Add(w.asked))
					ctx = lane.WithTicket(ctx, tk)
				}
				tickets = append(tickets, tk)
				go func() {
					r, _, err := g.Acquire(ctx, false)
					if err != nil {
						t.Error(err)
						return
					}
					granted <- i
					releases <- r
				}()
				await.Until(t, 5*time.Second, "waiter to queue", func() bool { return g.Waiting() == i+1 })
			}
			for i, w := range tc.waiters {
				if w.size >= 0 {
					tickets[i].Need(costOf(w.size))
				}
			}
			release()
			var got []int
			for range tc.waiters {
				got = append(got, <-granted)
				(<-releases)()
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("served %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFull(t *testing.T) {
	if New(0, 0).Full() {
		t.Fatal("an unlimited gate is full")
	}
	g := New(1, 0)
	if g.Full() {
		t.Fatal("full before any pull")
	}
	release := mustAcquire(t, g)
	if !g.Full() {
		t.Fatal("not full with its one slot taken")
	}
	release()
	if g.Full() {
		t.Fatal("full after the slot was given back")
	}
}

func TestCancelledWaitersLeakNothing(t *testing.T) {
	g := New(2, 0)
	held := []func(){mustAcquire(t, g), mustAcquire(t, g)}
	type queued struct {
		cancel context.CancelFunc
		done   chan error
		rel    chan func()
	}
	var qs []queued
	for i := range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		q := queued{cancel: cancel, done: make(chan error, 1), rel: make(chan func(), 1)}
		go func() {
			r, _, err := g.Acquire(ctx, false)
			if err == nil {
				q.rel <- r
			}
			q.done <- err
		}()
		qs = append(qs, q)
		await.Until(t, 5*time.Second, "waiter to queue", func() bool { return g.Waiting() == i+1 })
	}
	rand.Shuffle(len(qs), func(i, j int) { qs[i], qs[j] = qs[j], qs[i] })
	for _, q := range qs {
		q.cancel()
		if err := <-q.done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter got %v", err)
		}
	}
	if g.Waiting() != 0 {
		t.Fatalf("%d waiters left after all cancelled", g.Waiting())
	}
	for _, r := range held {
		r()
	}
	// Both slots are free again: two pulls start at once.
	a, b := mustAcquire(t, g), mustAcquire(t, g)
	if g.Running() != 2 {
		t.Fatalf("running %d", g.Running())
	}
	a()
	b()
	if g.Running() != 0 {
		t.Fatalf("running %d after release", g.Running())
	}
}

func TestQueueTimeoutIsResourceExhausted(t *testing.T) {
	g := New(1, 20*time.Millisecond)
	release := mustAcquire(t, g)
	defer release()
	_, waited, err := g.Acquire(context.Background(), false)
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("got %v, want ResourceExhausted", err)
	}
	for _, want := range []string{"1 slots", "max_parallel_image_pulls", "20ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	if waited < 20*time.Millisecond {
		t.Errorf("gave up after %s, before the timeout", waited)
	}
	if g.Waiting() != 0 {
		t.Fatalf("timed-out waiter still queued")
	}
}

func TestBypassSkipsFullQueue(t *testing.T) {
	g := New(1, 0)
	release := mustAcquire(t, g)
	queued := make(chan error, 1)
	go func() {
		r, _, err := g.Acquire(context.Background(), false)
		if err == nil {
			defer r()
		}
		queued <- err
	}()
	await.Until(t, 5*time.Second, "waiter to queue", func() bool { return g.Waiting() == 1 })

	sandbox, waited, err := g.Acquire(context.Background(), true)
	if err != nil || waited != 0 {
		t.Fatalf("bypass waited %s, err %v", waited, err)
	}
	// The bypass pull finishing must not let the waiter exceed the limit.
	sandbox()
	if g.Waiting() != 1 || g.Running() != 1 {
		t.Fatalf("after bypass release: running %d waiting %d, want 1 and 1", g.Running(), g.Waiting())
	}
	release()
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
}

func TestReleaseTwiceFreesOnce(t *testing.T) {
	g := New(1, 0)
	r := mustAcquire(t, g)
	r()
	r()
	if g.Running() != 0 {
		t.Fatalf("running %d", g.Running())
	}
	r2 := mustAcquire(t, g)
	defer r2()
	if g.Running() != 1 {
		t.Fatalf("running %d after double release and one acquire", g.Running())
	}
}

// costOf is the cost tests give a pull of bytes: 10 ms a MiB.
func costOf(bytes int64) time.Duration {
	return time.Duration(bytes * int64(time.Second) / (100 << 20))
}
