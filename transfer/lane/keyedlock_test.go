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

// TestKeyedLockWaited: a pull is waited for while it holds a key another
// caller waits on, and only then.
func TestKeyedLockWaited(t *testing.T) {
	k := NewKeyedLock()
	mine, other := NewTicket(time.Now()), NewTicket(time.Now())
	if err := k.Lock(WithTicket(context.Background(), mine), "chain"); err != nil {
		t.Fatal(err)
	}
	if k.Waited(mine) {
		t.Fatal("waited for with no one waiting")
	}
	locked := make(chan error)
	go func() { locked <- k.Lock(WithTicket(context.Background(), other), "chain") }()
	await.Until(t, 10*time.Second, "the second caller to wait on the key", func() bool { return k.Waited(mine) })
	if k.Waited(other) || k.Waited(nil) {
		t.Fatal("a waiter, or no pull, reported as waited for")
	}
	k.Unlock("chain")
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	if k.Waited(mine) || k.Waited(other) {
		t.Fatal("waited for after the key changed hands, with no one waiting")
	}
	k.Unlock("chain")
}
