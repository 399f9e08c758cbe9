package lane

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
	ch     chan struct{} // holds one token while the key is locked
	refs   int           // holders and waiters; the entry goes at zero
	holder *Ticket       // the holder's pull (TicketOf), or nil
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
		k.mu.Lock()
		l.holder = TicketOf(ctx)
		k.mu.Unlock()
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
	if ok {
		l.holder = nil
	}
	k.mu.Unlock()
	if !ok {
		panic("transfer: unlock of unlocked key " + key)
	}
	<-l.ch
	k.release(key, l)
}

// Waited reports whether work waits for a key that a pull with ticket t
// holds: containerd's unpacker locks a layer's chain ID before its blob is
// fetched and until it is committed, so every other pull of an image that
// shares the layer waits for that pull's writing of it (Pacer).
func (k *KeyedLock) Waited(t *Ticket) bool {
	if t == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range k.locks {
		if l.holder == t && l.refs > 1 {
			return true
		}
	}
	return false
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
