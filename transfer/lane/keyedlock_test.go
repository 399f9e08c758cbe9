package lane

import (
	"context"
	"errors"
	"runtime"
	"sync"
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
// they would without it.
func TestLentDueExtraPlaceOnlyUnderTheLock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		asker  func(big *Ticket) *Ticket
		guard  string
		first  bool // asks before the small pull waits on the lock
		passes bool
	}{
		{name: "another pull due before the lender", passes: true, asker: func(*Ticket) *Ticket {
			other := NewTicket(time.Now())
			other.Need(time.Minute)
			return other
		}},
		{name: "the lender's layer under the lock", guard: "chain", passes: true, asker: func(big *Ticket) *Ticket { return big }},
		{name: "the lender's layer under the lock, in line before the lend", guard: "chain", first: true, passes: true, asker: func(big *Ticket) *Ticket { return big }},
		{name: "the lender's next layer", asker: func(big *Ticket) *Ticket { return big }},
		{name: "the lender's layer under a lock nobody waits on", guard: "other", asker: func(big *Ticket) *Ticket { return big }},
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
			held, err := l.Acquire(WithTicket(context.Background(), big))
			if err != nil {
				t.Fatal(err)
			}

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
			defer cancel()
			locked := make(chan error, 1)
			go func() { locked <- k.Lock(ctx, "chain") }()
			defer func() {
				cancel()
				<-locked
			}()
			await.Until(t, 10*time.Second, "the big pull to lend the small pull's due", func() bool { return big.Due().Equal(small.Due()) })
			if got, want := big.OwnDueUnder("chain", now), small.Due(); !got.Equal(want) {
				t.Fatalf("work under the lock due at %v, want the waiter's %v", got.Sub(now), want.Sub(now))
			}
			if got, want := big.OwnDueUnder("other", now), big.OwnDue(); !got.Equal(want) {
				t.Fatalf("work under a lock nobody waits on due at %v, want its own %v", got.Sub(now), want.Sub(now))
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
			await.Until(t, 10*time.Second, "the lender's layer to wait in line", func() bool { return l.Waiting() == 1 })
			if n := l.extra.Taken(); n != 0 {
				t.Fatalf("%d extra places taken: a lent due took one for a layer not under the lock waited on", n)
			}
			held()
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		})
	}
}
