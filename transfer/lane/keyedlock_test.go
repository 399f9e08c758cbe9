package lane

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
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

// TestKeyedLockLends: while a pull waits on a key another holds, the
// holder is due no later than the waiter, and its work already in a lane
// moves up to that due; once the key changes hands, or the waiter gives
// up, the holder is due as before.
func TestKeyedLockLends(t *testing.T) {
	for _, giveUp := range []bool{false, true} {
		t.Run(fmt.Sprintf("waiter gives up=%v", giveUp), func(t *testing.T) {
			base := time.Now()
			holder, waiter, between := NewTicket(base), NewTicket(base), NewTicket(base)
			holder.Need(time.Hour)
			waiter.Need(time.Minute)
			between.Need(30 * time.Minute)
			own := holder.Due()

			l := New(1)
			k := NewKeyedLock(l)
			if err := k.Lock(WithTicket(context.Background(), holder), "chain"); err != nil {
				t.Fatal(err)
			}
			// The holder's layer and another pull's wait for the lane's
			// one place, the other pull first.
			full, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu    sync.Mutex
				order []string
				wg    sync.WaitGroup
			)
			for i, w := range []struct {
				name string
				t    *Ticket
			}{{"between", between}, {"holder", holder}} {
				wg.Go(func() {
					release, err := l.Acquire(WithTicket(context.Background(), w.t))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					order = append(order, w.name)
					mu.Unlock()
					release()
				})
				await.Until(t, 10*time.Second, w.name+" to wait in the lane", func() bool { return l.Waiting() == i+1 })
			}

			ctx, cancel := context.WithCancel(WithTicket(context.Background(), waiter))
			defer cancel()
			locked := make(chan error, 1)
			go func() { locked <- k.Lock(ctx, "chain") }()
			await.Until(t, 10*time.Second, "the holder to be due with the waiter", func() bool { return holder.Due().Equal(waiter.Due()) })
			full()
			wg.Wait()
			if want := []string{"holder", "between"}; !slices.Equal(order, want) {
				t.Fatalf("served %v, want %v: the holder's layer goes first while an earlier pull waits on its lock", order, want)
			}

			if giveUp {
				cancel()
				if err := <-locked; !errors.Is(err, context.Canceled) {
					t.Fatal(err)
				}
				if !holder.Due().Equal(own) {
					t.Fatalf("holder due %v after the waiter gave up, want its own %v", holder.Due().Sub(base), own.Sub(base))
				}
				k.Unlock("chain")
				return
			}
			k.Unlock("chain")
			if err := <-locked; err != nil {
				t.Fatal(err)
			}
			if !holder.Due().Equal(own) {
				t.Fatalf("holder due %v after unlocking, want its own %v", holder.Due().Sub(base), own.Sub(base))
			}
			k.Unlock("chain")
		})
	}
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
