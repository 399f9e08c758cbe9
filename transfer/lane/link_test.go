package lane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pullwise/pullwise/internal/await"
)

// fakeClock is a Link's clock that moves only when told.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestLinkBehind(t *testing.T) {
	base := time.Now()
	big := func() *Ticket { tk := NewTicket(base); tk.Need(costOf(1700 << 20)); return tk } // due 17 s on
	small := func(after time.Duration) *Ticket {
		tk := NewTicket(base.Add(after))
		tk.Need(costOf(20 << 20))
		return tk
	}
	asked := func(at, cost time.Duration) *Ticket {
		tk := NewTicket(base.Add(at))
		tk.Need(cost)
		return tk
	}
	// lending: a large pull holding a lock a small pull waits on
	// (KeyedLock), which lends it the small pull's due.
	lending := func() *Ticket { return lends(big(), small(0).Due()) }
	cases := []struct {
		name  string
		mine  *Ticket
		other *Ticket       // another body on the link, if any
		idle  time.Duration // since the other body last delivered bytes
		want  bool
		same  bool // the other body is the same pull's
	}{
		{name: "alone", mine: big()},
		{name: "big behind a small pull arriving", mine: big(), other: small(10 * time.Millisecond), want: true},
		{name: "the small pull never waits for the big one", mine: small(10 * time.Millisecond), other: big()},
		{name: "a small pull whose reader stopped holds nothing back", mine: big(), other: small(0), idle: 2 * active},
		{name: "pulls within the slack share", mine: small(0), other: small(500 * time.Millisecond)},
		{name: "a small pull asked long after the big one does not overtake it", mine: big(), other: small(20 * time.Second)},
		{name: "the same pull's bodies share", mine: big(), same: true},
		{name: "a late pull's body gives way to nobody", mine: asked(-time.Minute, 17*time.Second), other: asked(-time.Minute, 0)},
		{name: "a lending pull's body is seen at its own due", mine: asked(0, 5*time.Second), other: lending()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{t: base}
			l := NewLink(time.Second)
			l.now = clock.now
			mine := l.Open(WithTicket(context.Background(), tc.mine), nil)
			defer mine.Close()
			if tc.same {
				tc.other = tc.mine
			}
			if tc.other != nil {
				other := l.Open(WithTicket(context.Background(), tc.other), nil)
				defer other.Close()
				other.Moved()
			}
			clock.t = clock.t.Add(tc.idle)
			if got := mine.Behind(); got != tc.want {
				t.Fatalf("Behind() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLinkBehindWaiter: a body gives way to a sooner pull waiting for a
// download place, which it may hold itself, and to no later one: later
// by its own due, though it lends an earlier one.
func TestLinkBehindWaiter(t *testing.T) {
	base := time.Now()
	bigTicket := NewTicket(base)
	bigTicket.Need(costOf(1700 << 20))
	places := New(1)
	release, err := places.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l := NewLink(time.Second)
	big := l.Open(WithTicket(context.Background(), bigTicket), places)
	defer big.Close()
	if big.Behind() {
		t.Fatal("behind with no one waiting")
	}

	for _, w := range []struct {
		asked time.Time
		lends bool // the waiter lends a due as early as the big pull's (KeyedLock)
		want  bool
	}{
		{asked: base.Add(30 * time.Second)}, // due after the big pull
		{asked: base.Add(10 * time.Millisecond), want: true},
		{asked: base.Add(30 * time.Second), lends: true}, // seen at its own due
	} {
		tk := NewTicket(w.asked)
		tk.Need(costOf(20 << 20))
		if w.lends {
			lends(tk, base)
		}
		ctx, cancel := context.WithCancel(WithTicket(context.Background(), tk))
		done := make(chan error, 1)
		go func() {
			r, err := places.Acquire(ctx)
			if err == nil {
				r()
			}
			done <- err
		}()
		await.Until(t, 10*time.Second, "the waiter to wait for a place", func() bool { return places.Waiting() == 1 })
		if got := big.Behind(); got != w.want {
			t.Errorf("waiter asked %v after: Behind() = %v, want %v", w.asked.Sub(base), got, w.want)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	release()
}

func TestLinkYield(t *testing.T) {
	base := time.Now()
	bigTicket := NewTicket(base)
	bigTicket.Need(costOf(1700 << 20))
	smallTicket := NewTicket(base)
	smallTicket.Need(costOf(20 << 20))
	l := NewLink(time.Second)
	big := l.Open(WithTicket(context.Background(), bigTicket), nil)
	defer big.Close()
	small := l.Open(WithTicket(context.Background(), smallTicket), nil)
	small.Moved()

	// Still behind at the limit: the caller reads a little and asks again.
	if behind, err := big.Yield(context.Background(), 3*poll); err != nil || !behind {
		t.Fatalf("Yield = %v, %v; want still behind", behind, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := big.Yield(ctx, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Yield: %v", err)
	}
	// The small pull's body ends: the big one's goes on.
	done := make(chan bool, 1)
	go func() {
		behind, err := big.Yield(context.Background(), time.Minute)
		done <- behind || err != nil
	}()
	small.Close()
	if <-done {
		t.Fatal("Yield did not end when the small pull's body did")
	}
}

// TestLinkUnasked: a body not asked for yet is Behind as an open one
// would be, and waits until the body ahead is in; on no link there is
// nothing to ask.
func TestLinkUnasked(t *testing.T) {
	due := dueFrom(time.Now())
	l := NewLink(time.Second)
	big := l.Unasked(due(1700<<20), nil)
	if big.Behind() {
		t.Fatal("behind with nothing on the link")
	}
	small := l.Open(due(20<<20), nil)
	small.Moved()
	if !big.Behind() {
		t.Fatal("an unasked body of the big pull is not behind the small pull's arriving body")
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := big.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- big.Wait(context.Background()) }()
	small.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if big.Behind() {
		t.Fatal("still behind once the small pull's body is in")
	}

	var none *Link
	if none.Unasked(context.Background(), nil) != nil {
		t.Fatal("a nil link gave a body to ask")
	}
}
