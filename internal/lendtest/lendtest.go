// Package lendtest checks the priority inheritance of transfer/lane's
// KeyedLock against one line its holder's work waits in. The lines' own
// tests use it, and so does the plugin's, which must hand the lock every
// line that work done under it waits in: a line left out keeps the
// holder's work in its own place, and nothing else would notice.
package lendtest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/transfer/lane"
)

// Line is a line of work.
type Line struct {
	// Fill takes the line's places, with work without a ticket, and
	// returns what gives one back.
	Fill func(t *testing.T) (free func())
	// Do waits in line with ctx's pull's work named name, and gives its
	// place back once served.
	Do func(ctx context.Context, name string) error
	// Waiting is how many wait in line.
	Waiting func() int
	// First is the ticket of the first in line, or nil.
	First func() *lane.Ticket
	// Served lists the names of the work served, in order.
	Served func() []string
}

// HolderGoesFirst: a pull due in an hour holds a key, and work of a pull
// due in half an hour, then the holder's, wait in line. A pull due in a
// minute then waits on the key: the holder is due with it, and its work
// is served first. Then the waiter gives up (giveUp) or takes the key,
// and either way the holder is due as before.
func HolderGoesFirst(t *testing.T, locks *lane.KeyedLock, line Line, giveUp bool) {
	t.Helper()
	base := time.Now()
	pull := func(cost time.Duration) (context.Context, *lane.Ticket) {
		tk := lane.NewTicket(base)
		tk.Need(cost)
		return lane.WithTicket(context.Background(), tk), tk
	}
	holderCtx, holder := pull(time.Hour)
	betweenCtx, _ := pull(30 * time.Minute)
	waiterCtx, waiter := pull(time.Minute)
	own := holder.Due()

	if err := locks.Lock(holderCtx, "key"); err != nil {
		t.Fatal(err)
	}
	free := line.Fill(t)
	var wg sync.WaitGroup
	for i, w := range []struct {
		ctx  context.Context
		name string
	}{{betweenCtx, "between"}, {holderCtx, "holder"}} {
		wg.Go(func() {
			if err := line.Do(w.ctx, w.name); err != nil {
				t.Error(err)
			}
		})
		await.Until(t, 10*time.Second, w.name+" to wait in line", func() bool { return line.Waiting() == i+1 })
	}

	ctx, cancel := context.WithCancel(waiterCtx)
	defer cancel()
	locked := make(chan error, 1)
	go func() { locked <- locks.Lock(ctx, "key") }()
	await.Until(t, 10*time.Second, "the holder to be due with the waiter", func() bool { return holder.Due().Equal(waiter.Due()) })
	if got := holder.OwnDueUnder("key", base); !got.Equal(waiter.OwnDue()) {
		t.Fatalf("the holder's work under the key due %v, want the waiter's %v", got.Sub(base), waiter.OwnDue().Sub(base))
	}
	// The lock tells the lines after the holder's due has moved: freeing
	// the place in between would serve the line as it was.
	await.Until(t, 10*time.Second, "the holder's work to be first in line", func() bool { return line.First() == holder })
	free()
	wg.Wait()
	if got, want := line.Served(), []string{"holder", "between"}; !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v: the lock holder's work goes first while an earlier pull waits on its lock", got, want)
	}

	if giveUp {
		cancel()
		if err := <-locked; !errors.Is(err, context.Canceled) {
			t.Fatalf("the waiter that gave up got %v, want context.Canceled", err)
		}
		if !holder.Due().Equal(own) || !holder.OwnDueUnder("key", base).Equal(own) {
			t.Fatalf("holder due %v, %v under the key, after the waiter gave up, want its own %v", holder.Due().Sub(base), holder.OwnDueUnder("key", base).Sub(base), own.Sub(base))
		}
		locks.Unlock("key")
		return
	}
	locks.Unlock("key")
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	if !holder.Due().Equal(own) || !holder.OwnDueUnder("key", base).Equal(own) {
		t.Fatalf("holder due %v, %v under the key, after unlocking, want its own %v", holder.Due().Sub(base), holder.OwnDueUnder("key", base).Sub(base), own.Sub(base))
	}
	locks.Unlock("key")
}

// served records the order work was served in.
type served struct {
	mu    sync.Mutex
	names []string
}

func (s *served) add(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names = append(s.names, name)
}

func (s *served) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.names)
}

// Queue is what ImageWrites sees of the line its writes wait in
// (transfer/commits.Turns), as it sees a lane.Lane's.
type Queue interface {
	Waiting() int
	FirstOwner() *lane.Ticket
}

// Lane is the line for l's places, of which l has places (its limit). The
// fill gives one back when freed, so that the work in line is served one
// at a time, and the others when the test ends.
func Lane(l *lane.Lane, places int) Line {
	s := &served{}
	return Line{
		Fill: func(t *testing.T) func() {
			frees := make([]func(), places)
			for i := range frees {
				free, err := l.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				frees[i] = free
			}
			for _, free := range frees[1:] {
				t.Cleanup(free)
			}
			return frees[0]
		},
		Do: func(ctx context.Context, name string) error {
			release, err := l.Acquire(ctx)
			if err != nil {
				return err
			}
			s.add(name)
			release()
			return nil
		},
		Waiting: l.Waiting,
		First:   l.FirstOwner,
		Served:  s.list,
	}
}

// ImageWrites is the line of image writes through the store wrap
// returns, one at a time in q (transfer/commits' write turns, say). The
// fill is one write, held.
func ImageWrites(wrap func(images.Store) images.Store, q Queue) Line {
	s := &heldStore{held: make(chan struct{}), release: make(chan struct{})}
	store := wrap(s)
	return Line{
		Fill: func(t *testing.T) func() {
			done := make(chan error, 1)
			go func() {
				_, err := store.Update(context.Background(), images.Image{Name: fill})
				done <- err
			}()
			<-s.held
			return func() {
				close(s.release)
				if err := <-done; err != nil {
					t.Error(err)
				}
			}
		},
		Do: func(ctx context.Context, name string) error {
			_, err := store.Update(ctx, images.Image{Name: name})
			return err
		},
		Waiting: q.Waiting,
		First:   q.FirstOwner,
		Served:  s.served.list,
	}
}

// fill names the write that takes the one place.
const fill = "fill"

// heldStore is an image store that records its writes, but for the
// fill, which it holds until released.
type heldStore struct {
	images.Store
	held    chan struct{} // closed when the fill starts
	release chan struct{}
	served  served
}

func (s *heldStore) Update(ctx context.Context, img images.Image, _ ...string) (images.Image, error) {
	if img.Name == fill {
		close(s.held)
		<-s.release
		return img, nil
	}
	s.served.add(img.Name)
	return img, nil
}
