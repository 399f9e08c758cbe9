package transfer

import (
	"context"
	"sync"
)

// KeyedLock serializes work per key, such as fetching one blob or unpacking
// one chain ID. containerd's own keyed mutex is internal to its module, and
// the maintained alternatives (moby/locker, k8s keymutex) cannot give up
// waiting when the caller's context ends, which a cancelled pull must do.
type KeyedLock struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	ch   chan struct{} // holds one token while the key is locked
	refs int           // holders and waiters; the entry goes at zero
}

// NewKeyedLock returns an empty KeyedLock.
func NewKeyedLock() *KeyedLock {
	return &KeyedLock{locks: make(map[string]*keyLock)}
}

// Lock takes the lock for key, or returns ctx.Err() if ctx ends first.
func (k *KeyedLock) Lock(ctx context.Context, key string) error {
	k.mu.Lock()
	l, ok := k.locks[key]
	if !ok {
		l = &keyLock{ch: make(chan struct{}, 1)}
		k.locks[key] = l
	}
	l.refs++
	k.mu.Unlock()

	select {
	case l.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		k.release(key, l)
		return ctx.Err()
	}
}

// Unlock releases the lock for key. Unlocking a key that is not locked is a
// programming error and panics, as with sync.Mutex.
func (k *KeyedLock) Unlock(key string) {
	k.mu.Lock()
	l, ok := k.locks[key]
	k.mu.Unlock()
	if !ok {
		panic("transfer: unlock of unlocked key " + key)
	}
	<-l.ch
	k.release(key, l)
}

func (k *KeyedLock) release(key string, l *keyLock) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l.refs--
	if l.refs == 0 {
		delete(k.locks, key)
	}
}

// held reports how many keys have holders or waiters; tests use it to prove
// that cancelled waiters leave nothing behind.
func (k *KeyedLock) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.locks)
}
