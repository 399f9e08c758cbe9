package lane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pullwise/pullwise/internal/await"
)

// TestOldestPullFirst: with the lane full, waiters are served by ticket,
// not by arrival.
func TestOldestPullFirst(t *testing.T) {
	base := time.Now()
	// Arrive youngest first.
	ages := []time.Duration{5, 3, 4, 1, 2}
	var tickets []*Ticket
	for _, age := range ages {
		tickets = append(tickets, NewTicket(base.Add(age*time.Second)))
	}
	got := served(t, tickets)
	want := []int{3, 4, 1, 2, 0} // ages 1, 2, 3, 4, 5
	if !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
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
	await.Until(t, 10*time.Second, "the second acquire to wait", func() bool { return l.Waiting() == 1 })
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

// TestUnlimited: a lane without a limit gives every caller a place at
// once. A caller that waits fails the test, within seconds, rather than
// hanging it: the acquires run in a goroutine the test does not wait on
// forever, under a context that ends the wait of one put in line.
func TestUnlimited(t *testing.T) {
	const places = 100
	l := New(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var held atomic.Int32
	done := make(chan error, 1)
	go func() {
		for range places {
			if _, err := l.Acquire(ctx); err != nil {
				done <- err
				return
			}
			held.Add(1)
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("place %d of an unlimited lane not given at once: %v", held.Load()+1, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("an unlimited lane gave %d places of %d, and the next acquire has waited 10s", held.Load(), places)
	}
	if n := l.Waiting(); n != 0 {
		t.Fatalf("%d waiting in an unlimited lane", n)
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
			release, err := l.Acquire(WithTicket(ctx, NewTicket(time.Unix(int64(i%17), 0))))
			if err != nil {
				return
			}
			mu.Lock()
			in++
			top = max(top, in)
			mu.Unlock()
			// Hold the place a moment, so that others contend for it;
			// nothing waits on this pause.
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

// TestSizedTickets: once pulls know their bytes, a small pull asked for a
// little after a large one goes first; pulls of one size keep the order
// they were asked in; a pull asked for long after waits its turn.
func TestSizedTickets(t *testing.T) {
	base := time.Now()
	const mib = 1 << 20
	type pull struct {
		after time.Duration // asked for this long after base
		bytes int64         // -1: size not known yet
	}
	for _, tc := range []struct {
		name  string
		pulls []pull
		want  []int // indexes of pulls, in the order served
	}{
		{"a small pull asked just after a large one goes first", []pull{{0, 100 * mib}, {100 * time.Millisecond, mib}}, []int{1, 0}},
		{"but not one asked a while after", []pull{{0, 100 * mib}, {2 * time.Second, mib}}, []int{0, 1}},
		{"pulls of one size keep their order", []pull{{0, 10 * mib}, {time.Millisecond, 10 * mib}, {2 * time.Millisecond, 10 * mib}}, []int{0, 1, 2}},
		{"a pull of unknown size keeps the time it was asked for", []pull{{0, 100 * mib}, {10 * time.Millisecond, -1}, {20 * time.Millisecond, mib}}, []int{1, 2, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tickets []*Ticket
			for _, p := range tc.pulls {
				tk := NewTicket(base.Add(p.after))
				if p.bytes >= 0 {
					tk.Need(costOf(p.bytes))
				}
				tickets = append(tickets, tk)
			}
			got := served(t, tickets)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("served %v, want %v", got, tc.want)
			}
		})
	}
}

// served queues work with each ticket, in the given order, behind a full
// lane of one place, and returns the order it was served in.
func served(t *testing.T, tickets []*Ticket) []int {
	t.Helper()
	l := New(1)
	hold, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
	)
	for i, tk := range tickets {
		wg.Go(func() {
			release, err := l.Acquire(WithTicket(context.Background(), tk))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			release()
		})
		await.Until(t, 10*time.Second, fmt.Sprintf("work %d to wait in line", i), func() bool { return l.Waiting() == i+1 })
	}
	hold()
	wg.Wait()
	return order
}

// TestOvertaking: in an overtaking lane, work due well before everything
// holding a place takes one beyond the limit, up to the limit again; later
// work, or work within the slack, waits its turn; and every place comes
// back.
func TestOvertaking(t *testing.T) {
	base := time.Now()
	due := func(after time.Duration, bytes int64) context.Context {
		tk := NewTicket(base.Add(after))
		tk.Need(costOf(bytes))
		return WithTicket(context.Background(), tk)
	}
	big, small := due(0, 1700<<20), due(10*time.Millisecond, 20<<20)
	cases := []struct {
		name    string
		lane    *Lane
		holders []context.Context // fill the lane, in order
		asker   context.Context
		want    bool // the asker gets a place at once
		// queued is the lane as a waiting asker found it (its debug
		// line's queued_* fields); nil: none is kept.
		queued *queued
	}{
		{"small overtakes big", Overtaking(2, time.Second), []context.Context{big, big}, small, true, nil},
		{"big does not overtake small", Overtaking(2, time.Second), []context.Context{small, small}, big, false,
			&queued{running: 2, lead: costOf(20<<20) - costOf(1700<<20) + 10*time.Millisecond}},
		{"not while a holder is due as soon", Overtaking(2, time.Second), []context.Context{big, small}, small, false,
			&queued{running: 2}},
		{"within the slack", Overtaking(2, time.Second), []context.Context{due(0, 120<<20), due(0, 120<<20)}, due(0, 40<<20), false,
			&queued{running: 2, lead: costOf(80 << 20)}},
		{"up to the limit beyond it", Overtaking(1, time.Second), []context.Context{big, small}, small, false,
			&queued{running: 2, extra: 1}},
		{"a plain lane never", New(2), []context.Context{big, big}, small, false, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var releases []func()
			for _, ctx := range tc.holders {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				r, err := tc.lane.Acquire(ctx)
				cancel()
				if err != nil {
					t.Fatalf("filling the lane: %v", err)
				}
				releases = append(releases, r)
			}
			ctx, cancel := context.WithCancel(tc.asker)
			got := make(chan func(), 1)
			go func() {
				r, err := tc.lane.Acquire(ctx)
				if err == nil {
					got <- r
				}
				close(got)
			}()
			if tc.want {
				r := <-got
				if r == nil {
					t.Fatal("no place")
				}
				releases = append(releases, r)
			} else {
				await.Until(t, 10*time.Second, "the asker to wait", func() bool { return tc.lane.Waiting() == 1 })
				tc.lane.mu.Lock()
				q := tc.lane.waiting[0].queued
				tc.lane.mu.Unlock()
				if (q == nil) != (tc.queued == nil) || q != nil && *q != *tc.queued {
					t.Fatalf("the waiting asker found the lane %+v, want %+v", q, tc.queued)
				}
			}
			cancel()
			<-got
			for _, r := range releases {
				r()
			}
			// Every place came back: the limit is free again, and no more.
			limit := tc.lane.limit
			for range limit {
				if _, err := tc.lane.Acquire(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lane.running != limit || tc.lane.extra.Taken() != 0 {
				t.Fatalf("running %d, extra %d after the limit's %d", tc.lane.running, tc.lane.extra, limit)
			}
		})
	}
}

// costOf is the cost tests give a pull of bytes: 10 ms a MiB.
func costOf(bytes int64) time.Duration {
	return time.Duration(bytes * int64(time.Second) / (100 << 20))
}

// TestLate: a pull past its due takes an extra place at once, however due
// the holders are; one that turns late while waiting takes the next extra
// place given back; and a pull whose cost is unknown is never late.
func TestLate(t *testing.T) {
	now := time.Now()
	ticket := func(asked time.Time, cost time.Duration) context.Context {
		tk := NewTicket(asked)
		if cost >= 0 {
			tk.Need(cost)
		}
		return WithTicket(context.Background(), tk)
	}
	late := ticket(now.Add(-time.Minute), 10*time.Second)
	soon := ticket(now.Add(-time.Minute), 0) // due well before the late one
	unknown := ticket(now.Add(-time.Minute), -1)

	l := Overtaking(1, time.Second)
	held, err := l.Acquire(soon)
	if err != nil {
		t.Fatal(err)
	}
	lateDone, err := l.Acquire(late)
	if err != nil {
		t.Fatalf("late pull: %v", err)
	}
	if l.extra.Taken() != 1 {
		t.Fatalf("extra places %d, want the late pull's", l.extra.Taken())
	}

	got := make(chan error, 1)
	go func() {
		r, err := l.Acquire(unknown)
		if err == nil {
			r()
		}
		got <- err
	}()
	await.Until(t, 10*time.Second, "the pull of unknown cost to wait", func() bool { return l.Waiting() == 1 })
	lateDone()
	if l.Waiting() != 1 {
		t.Fatal("a pull of unknown cost took the extra place given back")
	}
	held()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if l.running != 0 || l.extra.Taken() != 0 {
		t.Fatalf("places left: running %d, extra %d", l.running, l.extra.Taken())
	}
}

// TestExtraPastTheFirstInLine: a large pull's layer is first in line by a
// due its pull lends (KeyedLock) and may not take an extra place, since
// its own due is the large pull's. An extra place given back goes to the
// work behind it that may take one, rather than staying free until a
// place within the limit comes back, or going to newcomers: a small pull
// due well before the holders, or a pull past its due (under kubelet, two
// small pulls found the extra places taken and waited 10 s in line,
// late, behind a large image's layers).
func TestExtraPastTheFirstInLine(t *testing.T) {
	now := time.Now()
	ticket := func(asked time.Time, cost time.Duration) *Ticket {
		tk := NewTicket(asked)
		tk.Need(cost)
		return tk
	}
	for _, tc := range []struct {
		name   string
		behind *Ticket
	}{
		{"ahead of the holders", ticket(now, time.Second)},
		{"late", ticket(now.Add(-2*time.Hour), time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			big, small := ticket(now, time.Hour), ticket(now, time.Second)
			lender := lends(ticket(now, time.Hour), now.Add(-3*time.Hour)) // first in line, due as a large pull by its own
			l := Overtaking(1, time.Second)
			held, err := l.Acquire(WithTicket(context.Background(), big))
			if err != nil {
				t.Fatal(err)
			}
			extra, err := l.Acquire(WithTicket(context.Background(), small))
			if err != nil {
				t.Fatalf("the small pull's first layer: %v", err)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			lenderGot, behindGot := make(chan error, 1), make(chan error, 1)
			for _, w := range []struct {
				t   *Ticket
				got chan error
			}{{lender, lenderGot}, {tc.behind, behindGot}} {
				n := l.Waiting()
				go func() {
					release, err := l.Acquire(WithTicket(ctx, w.t))
					if err == nil {
						release()
					}
					w.got <- err
				}()
				// The lender in line first, as under kubelet.
				await.Until(t, 10*time.Second, "the layer to wait in line", func() bool { return l.Waiting() == n+1 })
			}
			extra()
			if err := <-behindGot; err != nil {
				t.Fatalf("the layer behind the lender's did not take the extra place given back: %v", err)
			}
			if n := l.Waiting(); n != 1 {
				t.Fatalf("%d waiting, want the lender's layer", n)
			}
			held()
			if err := <-lenderGot; err != nil {
				t.Fatal(err)
			}
		})
	}
}
