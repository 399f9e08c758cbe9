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

// TestLentDueGivesNoExtraPlace: a large pull holds a chain lock a small
// pull waits on, and one of its layers holds the lane's one place. Extra
// places go by own dues: another pull due well before the large one
// passes that layer at once, though the large pull lends a due as early
// as the other's; the large pull's next layer, moved up in line by the
// lend, waits for a place as it would without it.
func TestLentDueGivesNoExtraPlace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		asker  func(big *Ticket) *Ticket
		passes bool
	}{
		{name: "another pull due before the lender", passes: true, asker: func(*Ticket) *Ticket {
			other := NewTicket(time.Now())
			other.Need(time.Minute)
			return other
		}},
		{name: "the lender's next layer", asker: func(big *Ticket) *Ticket { return big }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			big, small := NewTicket(now), NewTicket(now)
			big.Need(time.Hour)
			small.Need(time.Minute)
			l := Overtaking(1, time.Second)
			k := NewKeyedLock(l)
			if err := k.Lock(WithTicket(context.Background(), big), "chain"); err != nil {
				t.Fatal(err)
			}
			defer k.Unlock("chain")
			held, err := l.Acquire(WithTicket(context.Background(), big))
			if err != nil {
				t.Fatal(err)
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

			asking, stop := context.WithTimeout(WithTicket(context.Background(), tc.asker(big)), 10*time.Second)
			defer stop()
			got := make(chan error, 1)
			go func() {
				release, err := l.Acquire(asking)
				if err == nil {
					release()
				}
				got <- err
			}()
			if tc.passes {
				if err := <-got; err != nil {
					t.Fatalf("waited for the place the lender's layer holds: %v", err)
				}
				held()
				return
			}
			await.Until(t, 10*time.Second, "the lender's layer to wait in line", func() bool { return l.Waiting() == 1 })
			if n := l.extra.Taken(); n != 0 {
				t.Fatalf("%d extra places taken: a lent due took one", n)
			}
			held()
			if err := <-got; err != nil {
				t.Fatal(err)
			}
		})
	}
}
