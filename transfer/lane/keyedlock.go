package lane

import (
	"context"
	"sync"
	"time"

	"github.com/containerd/log"
)

// KeyedLock serializes work per key, such as fetching one blob or unpacking
// one chain ID. containerd's own keyed mutex is internal to its module, and
// the maintained alternatives (moby/locker, k8s keymutex) cannot give up
// waiting when the caller's context ends, which a cancelled pull must do.
type KeyedLock struct {
	mu    sync.Mutex
	locks map[string]*keyLock
	// lines learn when a holder's due moves (Lend).
	lines []Lender
}

// A Lender is a line that work waits in for a place (a Lane, or one it
// wraps, such as transfer/commits' write turns): Lend moves t's work
// waiting there up to t's Due.
type Lender interface {
	Lend(t *Ticket)
}

type keyLock struct {
	ch      chan struct{}   // holds one token while the key is locked
	refs    int             // holders and waiters; the entry goes at zero
	holder  *Ticket         // the holder's pull (TicketOf), or nil
	waiters map[*Ticket]int // the waiters' pulls, counted
}

// NewKeyedLock returns an empty KeyedLock whose holders lend their
// waiters' dues (Ticket.Due) to their work waiting in lines: those that
// the work done under a lock waits in, or the waiter waits there behind
// work due after it.
func NewKeyedLock(lines ...Lender) *KeyedLock {
	return &KeyedLock{locks: make(map[string]*keyLock), lines: lines}
}

// Lock takes the lock for key, or returns ctx.Err() if ctx ends first.
// While it waits, the holder is due no later than the waiter.
func (k *KeyedLock) Lock(ctx context.Context, key string) error {
	mine := TicketOf(ctx)
	k.mu.Lock()
	l, ok := k.locks[key]
	if !ok {
		l = &keyLock{ch: make(chan struct{}, 1), waiters: map[*Ticket]int{}}
		k.locks[key] = l
	}
	l.refs++
	select {
	case l.ch <- struct{}{}:
		l.holder = mine
		// A waiter that had not reached its receive when the key was
		// freed waits on this pull now: it lends as it would to the
		// holder it found.
		var lent *Ticket
		if len(l.waiters) > 0 {
			lent = k.lend(mine)
		}
		k.mu.Unlock()
		k.moved(lent)
		return nil
	default:
	}
	if mine != nil {
		l.waiters[mine]++
	}
	lent := k.lend(l.holder)
	k.mu.Unlock()
	k.moved(lent)
	asked := time.Now()

	defer func() {
		k.mu.Lock()
		if mine != nil {
			if l.waiters[mine]--; l.waiters[mine] == 0 {
				delete(l.waiters, mine)
			}
			k.lend(l.holder) // a waiter that gave up lends no more
		}
		k.mu.Unlock()
	}()
	select {
	case l.ch <- struct{}{}:
		k.mu.Lock()
		l.holder = mine
		lent = k.lend(mine)
		k.mu.Unlock()
		k.moved(lent)
		// A pull waits here for another pull's fetch of a blob both
		// images hold, or its unpacking of a layer both share: time that
		// no lane's line shows.
		waited := time.Since(asked)
		mine.Waited(WaitLock, waited)
		log.G(ctx).WithFields(log.Fields{"key": key, "waited": waited}).Debug("waited for another pull's lock")
		return nil
	case <-ctx.Done():
		k.release(key, l)
		return ctx.Err()
	}
}

// lend sets t's lent due to the earliest due of the work waiting on keys
// t holds, and each key's to the earliest own due of its waiters
// (Ticket.OwnDueUnder), and returns t if either moved earlier. k.mu must
// be held.
func (k *KeyedLock) lend(t *Ticket) *Ticket {
	if t == nil {
		return nil
	}
	var earliest int64
	var on map[string]int64
	for key, l := range k.locks {
		if l.holder != t {
			continue
		}
		for w := range l.waiters {
			if w == t {
				continue
			}
			d := w.Due().UnixNano()
			if earliest == 0 || d < earliest {
				earliest = d
			}
			// A key's due is its waiters' own: one they lend in turn
			// would outlive its lender here, since only a lock's own
			// events recompute it.
			own := w.OwnDue().UnixNano()
			if on == nil {
				on = map[string]int64{}
			}
			if e, ok := on[key]; !ok || own < e {
				on[key] = own
			}
		}
	}
	// Per key first: a reader that sees the whole pull's due move sees
	// the key's too.
	var was map[string]int64
	if p := t.lentOn.Swap(mapOrNil(on)); p != nil {
		was = *p
	}
	before := t.lent.Swap(earliest)
	moved := earliest != 0 && (before == 0 || earliest < before)
	for key, d := range on {
		if e, ok := was[key]; !ok || d < e {
			moved = true
		}
	}
	if moved {
		return t
	}
	return nil
}

// mapOrNil is a pointer to m, nil for no map: a ticket that lends nothing
// keeps no map to look in.
func mapOrNil(m map[string]int64) *map[string]int64 {
	if m == nil {
		return nil
	}
	return &m
}

// moved tells the lines that t is due earlier.
func (k *KeyedLock) moved(t *Ticket) {
	if t == nil {
		return
	}
	for _, l := range k.lines {
		l.Lend(t)
	}
}

// Unlock releases the lock for key. Unlocking a key that is not locked is a
// programming error and panics, as with sync.Mutex.
func (k *KeyedLock) Unlock(key string) {
	k.mu.Lock()
	l, ok := k.locks[key]
	if ok {
		t := l.holder
		l.holder = nil
		k.lend(t) // what it still holds, if anything, lends on
	}
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
