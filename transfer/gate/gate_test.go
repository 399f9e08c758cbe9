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

// asked is the context of a pull asked for at asked that costs cost.
func asked(at time.Time, cost time.Duration) context.Context {
	tk := lane.NewTicket(at)
	tk.Need(cost)
	return lane.WithTicket(context.Background(), tk)
}

// TestSlotBesidePullGivingWay: while every body of a pull holding a slot
// gives way, the first pull in line, sized and due more than the slack
// before it, takes a slot beside it: one per such pull, and the limit
// holds again once either is done.
func TestSlotBesidePullGivingWay(t *testing.T) {
	// pull is asked for now: a case's holder is not late before it ends,
	// however long the cases before it took.
	pull := func(cost time.Duration) context.Context { return asked(time.Now(), cost) }
	// granted must get a slot, within far more looks than it needs.
	granted := func(t *testing.T, g *Gate, ctx context.Context) func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		release, _, err := g.Acquire(ctx, false)
		if err != nil {
			t.Fatalf("no slot beside: %v", err)
		}
		return release
	}
	// notGranted waits a few of the gate's looks for a slot that must not come.
	notGranted := func(t *testing.T, g *Gate, ctx context.Context, why string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 10*lane.Poll)
		defer cancel()
		if release, _, err := g.Acquire(ctx, false); err == nil {
			release()
			t.Fatalf("a slot beside: %s", why)
		}
	}
	link := lane.NewLink(lane.Slack)
	unsized := func() context.Context { return lane.WithTicket(context.Background(), lane.NewTicket(time.Now())) }
	// Asked an hour ago: one due half an hour ago, late, and one due
	// long before it.
	anHourAgo := func(cost time.Duration) func() context.Context {
		return func() context.Context { return asked(time.Now().Add(-time.Hour), cost) }
	}
	now := func(cost time.Duration) func() context.Context {
		return func() context.Context { return pull(cost) }
	}
	cases := []struct {
		name           string
		holder, waiter func() context.Context // asked for as the case starts
		pauses         bool                   // the holder's one body gives way
		granted        bool
	}{
		{name: "a small pull beside a large one giving way", holder: now(time.Hour), waiter: now(time.Second), pauses: true, granted: true},
		{name: "not while the large one reads", holder: now(time.Hour), waiter: now(time.Second)},
		{name: "not for a pull within the slack", holder: now(2 * time.Second), waiter: now(1500 * time.Millisecond), pauses: true},
		{name: "not for a pull behind", holder: now(time.Second), waiter: now(time.Hour), pauses: true},
		{name: "not for a pull whose size is not known", holder: now(time.Hour), waiter: unsized, pauses: true},
		{name: "not beside a late pull", holder: anHourAgo(30 * time.Minute), waiter: anHourAgo(time.Second), pauses: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := New(1, 0)
			holder := tc.holder()
			release, _, err := g.Acquire(holder, false)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			body := link.Open(holder, nil)
			defer body.Close()
			body.SetGivingWay(tc.pauses)
			if !tc.granted {
				notGranted(t, g, tc.waiter(), "")
				return
			}
			beside := granted(t, g, tc.waiter())
			if g.Running() != 2 {
				t.Fatalf("running %d: want the holder's slot and one beside", g.Running())
			}
			notGranted(t, g, tc.waiter(), "a second one beside the same pull")
			beside()
			if g.Running() != 1 {
				t.Fatalf("running %d once the pull beside is done, want 1", g.Running())
			}
			// The holder may let another in once the first is gone.
			again := granted(t, g, tc.waiter())
			// The holder ends first: the pull beside keeps its slot, and
			// the limit holds again for the next.
			release()
			if g.Running() != 1 {
				t.Fatalf("running %d once the holder is done, want the one beside", g.Running())
			}
			notGranted(t, g, tc.waiter(), "the holder is gone, the limit is full")
			again()
			other := mustAcquire(t, g)
			defer other()
			notGranted(t, g, tc.waiter(), "beside a pull that is done")
		})
	}

	// holding takes a slot, bypassing the limit or not, for a large pull
	// whose one body gives way.
	holding := func(t *testing.T, g *Gate, bypass bool) {
		ctx := pull(time.Hour)
		release, _, err := g.Acquire(ctx, bypass)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(release)
		body := link.Open(ctx, nil)
		t.Cleanup(body.Close)
		body.SetGivingWay(true)
	}
	t.Run("one beside each of two pulls giving way, and no third", func(t *testing.T) {
		g := New(2, 0)
		holding(t, g, false)
		holding(t, g, false)
		t.Cleanup(granted(t, g, pull(time.Second)))
		t.Cleanup(granted(t, g, pull(time.Second)))
		notGranted(t, g, pull(time.Second), "a third beside two pulls giving way")
	})
	t.Run("never more than the limit over it", func(t *testing.T) {
		g := New(1, 0)
		holding(t, g, false)
		holding(t, g, true) // the sandbox image's, say: over the limit
		holding(t, g, true)
		notGranted(t, g, pull(time.Second), "with the slots over the limit by the limit already")
	})
}

// TestSlotsBesideLeakNothing: pulls taking, giving up and ending slots
// beside a pull that gives way on and off take no more than one slot
// beside it, and leave every slot free.
func TestSlotsBesideLeakNothing(t *testing.T) {
	const limit, pulls = 2, 40
	g := New(limit, 0)
	base := time.Now()
	pull := func(cost time.Duration) context.Context { return asked(base, cost) }
	large := pull(time.Hour)
	releaseLarge, _, err := g.Acquire(large, false)
	if err != nil {
		t.Fatal(err)
	}
	other := mustAcquire(t, g)
	body := lane.NewLink(lane.Slack).Open(large, nil)
	defer body.Close()
	// Giving way until the first pull is let in beside it, and then on
	// and off (below): toggled from the start, every waiter could give
	// up before a look found it giving way.
	body.SetGivingWay(true)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		holding int
		most    int
	)
	for i := range pulls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(pull(time.Second), time.Duration(50+rand.IntN(200))*time.Millisecond)
			defer cancel()
			release, _, err := g.Acquire(ctx, false)
			if err != nil {
				return // gave up waiting
			}
			mu.Lock()
			holding++
			most = max(most, holding)
			mu.Unlock()
			if i%3 == 0 {
				<-ctx.Done() // some hold theirs for a while
			}
			mu.Lock()
			holding--
			mu.Unlock()
			release()
		}()
	}
	// With both slots held, the waiting pulls get only the one beside
	// the large pull; then the other holder ends, and its slot goes to
	// the line.
	await.Until(t, 10*time.Second, "a pull to take a slot beside the large one", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return most > 0
	})
	stop := make(chan struct{})
	toggled := make(chan struct{})
	go func() {
		defer close(toggled)
		// At random times: toggled in step with the gate's looks, it
		// could read on whenever they look.
		for on := true; ; on = !on {
			body.SetGivingWay(on)
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(1+rand.IntN(9)) * time.Millisecond):
			}
		}
	}()
	mu.Lock()
	if most > 1 {
		t.Errorf("%d pulls held slots at once beside the large and the other, want 1", most)
	}
	mu.Unlock()
	other()
	wg.Wait()
	close(stop)
	<-toggled
	if most > limit {
		t.Fatalf("%d pulls held slots at once beside the large one, want at most %d", most, limit)
	}
	releaseLarge()
	if g.Running() != 0 || g.Waiting() != 0 {
		t.Fatalf("running %d, waiting %d after every pull ended", g.Running(), g.Waiting())
	}
	a, b := mustAcquire(t, g), mustAcquire(t, g)
	defer a()
	defer b()
	if g.Running() != limit {
		t.Fatalf("running %d, want %d: the slots are not all free", g.Running(), limit)
	}
}
