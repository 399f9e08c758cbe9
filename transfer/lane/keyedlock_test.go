package lane

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pullwise/pullwise/internal/await"
)

func TestKeyedLockExcludesPerKey(t *testing.T) {
	k := NewKeyedLock()
	ctx := context.Background()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		inside  int
		maxSeen int
	)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := k.Lock(ctx, "a"); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			inside++
			maxSeen = max(maxSeen, inside)
			mu.Unlock()
			runtime.Gosched() // give a second holder the chance to show up
			mu.Lock()
			inside--
			mu.Unlock()
			k.Unlock("a")
		}()
	}
	wg.Wait()
	if maxSeen != 1 {
		t.Fatalf("%d holders of one key at once, want 1", maxSeen)
	}
	if n := k.held(); n != 0 {
		t.Fatalf("%d keys left after all unlocked", n)
	}
}

func TestKeyedLockOtherKeysIndependent(t *testing.T) {
	k := NewKeyedLock()
	ctx := context.Background()
	if err := k.Lock(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// Must not block: another key is free.
	if err := k.Lock(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	k.Unlock("b")
	k.Unlock("a")
}

func TestKeyedLockCancelledWaiterLeavesNoTrace(t *testing.T) {
	k := NewKeyedLock()
	if err := k.Lock(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- k.Lock(ctx, "a") }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter got %v, want context.Canceled", err)
	}
	k.Unlock("a")
	if n := k.held(); n != 0 {
		t.Fatalf("%d keys left after cancel and unlock", n)
	}
	// The key is usable again.
	if err := k.Lock(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	k.Unlock("a")
}

func TestKeyedLockUnlockUnlockedPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on unlock of an unlocked key")
		}
	}()
	NewKeyedLock().Unlock("nope")
}

// TestLentDueExtraPlaceOnlyUnderTheLock: a large pull holds a chain lock
// a small pull waits on, and one of its layers holds the lane's one
// place. Extra places go by own dues: another pull due well before the
// large one passes that layer at once, though the large pull lends a due
// as early as the other's, and so does the large pull's layer written
// under the lock waited on, whose own due is the lent one (Guards),
// whether it asks before or after the small pull comes to wait; the large
// pull's other layers, moved up in line by the lend, wait for a place as
// they would without it, and so does the layer under the lock once the
// small pull gives up. A layer under the lock holding the place counts by
// the lent due: a pull due between the two does not pass it.
func TestLentDueExtraPlaceOnlyUnderTheLock(t *testing.T) {
	between := func(*Ticket) *Ticket {
		other := NewTicket(time.Now())
		other.Need(30 * time.Minute)
		return other
	}
	lender := func(big *Ticket) *Ticket { return big }
	for _, tc := range []struct {
		name      string
		asker     func(big *Ticket) *Ticket
		guard     string // the asking work's lock
		heldUnder string // the lock the held place's layer is written under
		first     bool   // asks before the small pull waits on the lock
		giveUp    bool   // the small pull gives up waiting before the ask
		passes    bool
	}{
		{name: "another pull due before the lender", passes: true, asker: between},
		{name: "the lender's layer under the lock", guard: "chain", passes: true, asker: lender},
		{name: "the lender's layer under the lock, in line before the lend", guard: "chain", first: true, passes: true, asker: lender},
		{name: "the lender's next layer", asker: lender},
		{name: "the lender's layer under a lock nobody waits on", guard: "other", asker: lender},
		{name: "the lender's layer under the lock, after the waiter gave up", guard: "chain", giveUp: true, asker: lender},
		{name: "a pull due between them, beside the layer under the lock", heldUnder: "chain", asker: between},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			big, small := NewTicket(now), NewTicket(now)
			big.Need(time.Hour)
			small.Need(time.Minute)
			l := Overtaking(1, time.Second)
			k := NewKeyedLock(l)
			for _, key := range []string{"chain", "other"} {
				if err := k.Lock(WithTicket(context.Background(), big), key); err != nil {
					t.Fatal(err)
				}
				defer k.Unlock(key)
			}
			h, err := l.acquire(WithTicket(context.Background(), big), tc.heldUnder)
			if err != nil {
				t.Fatal(err)
			}
			held := l.releaser(h)

			asking, stop := context.WithTimeout(WithTicket(context.Background(), tc.asker(big)), 10*time.Second)
			defer stop()
			got := make(chan error, 1)
			ask := func() {
				go func() {
					h, err := l.acquire(asking, tc.guard)
					if err == nil {
						l.releaser(h)()
					}
					got <- err
				}()
			}
			if tc.first {
				ask()
				await.Until(t, 10*time.Second, "the layer to wait in line", func() bool { return l.Waiting() == 1 })
			}

			ctx, cancel := context.WithCancel(WithTicket(context.Background(), small))
			locked := make(chan error, 1)
			go func() { locked <- k.Lock(ctx, "chain") }()
			stopWaiting := sync.OnceFunc(func() {
				cancel()
				<-locked
			})
			defer stopWaiting()
			await.Until(t, 10*time.Second, "the big pull to lend the small pull's due", func() bool { return big.Due().Equal(small.Due()) })
			if got, want := big.OwnDueUnder("chain", now), small.Due(); !got.Equal(want) {
				t.Fatalf("work under the lock due at %v, want the waiter's %v", got.Sub(now), want.Sub(now))
			}
			if got, want := big.OwnDueUnder("other", now), big.OwnDue(); !got.Equal(want) {
				t.Fatalf("work under a lock nobody waits on due at %v, want its own %v", got.Sub(now), want.Sub(now))
			}
			if tc.giveUp {
				stopWaiting()
				if got, want := big.OwnDueUnder("chain", now), big.OwnDue(); !got.Equal(want) {
					t.Fatalf("work under the lock due at %v once nobody waits, want its own %v", got.Sub(now), want.Sub(now))
				}
			}

			if !tc.first {
				ask()
			}
			if tc.passes {
				if err := <-got; err != nil {
					t.Fatalf("waited for the place the lender's layer holds: %v", err)
				}
				held()
				return
			}
			await.Until(t, 10*time.Second, "the work to wait in line", func() bool { return l.Waiting() == 1 })
			if n := l.extra.Taken(); n != 0 {
				t.Fatalf("%d extra places taken: the asking work passed the layer holding the place", n)
			}
			held()
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// toldLine counts the times a KeyedLock tells its line that a holder's
// due moved earlier.
type toldLine struct{ n atomic.Int32 }

func (l *toldLine) Lend(*Ticket) { l.n.Add(1) }

// TestKeyedLockLendsPerKey: a pull holds two locks; a second waiter, on
// the other lock and due after the first, moves no whole-pull due, but
// the work under its lock is due with it, and the lines are told.
func TestKeyedLockLendsPerKey(t *testing.T) {
	now := time.Now()
	holder, first, second := NewTicket(now), NewTicket(now), NewTicket(now)
	holder.Need(time.Hour)
	first.Need(time.Minute)
	second.Need(2 * time.Minute)
	line := &toldLine{}
	k := NewKeyedLock(line)
	for _, key := range []string{"a", "b"} {
		if err := k.Lock(WithTicket(context.Background(), holder), key); err != nil {
			t.Fatal(err)
		}
		defer k.Unlock(key)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i, w := range []struct {
		ticket *Ticket
		key    string
	}{{first, "a"}, {second, "b"}} {
		wg.Go(func() { _ = k.Lock(WithTicket(ctx, w.ticket), w.key) })
		await.Until(t, 10*time.Second, "the holder to lend the waiter's due on "+w.key, func() bool {
			return holder.OwnDueUnder(w.key, now).Equal(w.ticket.Due())
		})
		await.Until(t, 10*time.Second, "the line to be told", func() bool { return line.n.Load() == int32(i+1) })
	}
	if got, want := holder.Due(), first.Due(); !got.Equal(want) {
		t.Fatalf("holder due at %v, want the first waiter's %v", got.Sub(now), want.Sub(now))
	}
}
