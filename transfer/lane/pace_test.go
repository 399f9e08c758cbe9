package lane

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/await"
)

// writer is a layer applier whose layer waits on its pacer, as the gzip
// reader does before every Read.
type writer struct {
	diff.Applier
	started chan *Pacer
	err     chan error
}

func (w writer) Apply(ctx context.Context, _ ocispec.Descriptor, _ []mount.Mount, _ ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	p := PacerOf(ctx)
	w.started <- p
	err := p.Wait(ctx)
	w.err <- err
	return ocispec.Descriptor{}, err
}

// dueFrom returns the context of a pull of bytes asked for at base.
func dueFrom(base time.Time) func(bytes int64) context.Context {
	return func(bytes int64) context.Context {
		tk := NewTicket(base)
		tk.Size(bytes)
		return WithTicket(context.Background(), tk)
	}
}

// TestPacer: a layer being written gives way while a layer of a pull due
// more than the slack before it holds a place, and only then; cancelling
// it while it waits frees its place.
func TestPacer(t *testing.T) {
	due := dueFrom(time.Now())
	big, small := due(1700<<20), due(20<<20)
	cases := []struct {
		name    string
		lane    *Lane
		holder  context.Context // holds a place while the layer starts
		layer   context.Context
		paused  bool // the layer waits until the holder is done
		noPacer bool
		waited  bool // others wait for the layer's pull (Applier.Waited)
	}{
		{name: "large layer gives way to a small pull's", lane: Overtaking(2, time.Second), holder: small, layer: big, paused: true},
		{name: "small layer does not give way to a large pull's", lane: Overtaking(2, time.Second), holder: big, layer: small},
		{name: "within the slack", lane: Overtaking(2, time.Second), holder: due(40 << 20), layer: due(120 << 20)},
		{name: "a plain lane never paces", lane: New(2), holder: small, layer: big, noPacer: true},
		{name: "not while others wait for the pull", lane: Overtaking(2, time.Second), holder: small, layer: big, waited: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			release, err := tc.lane.Acquire(tc.holder)
			if err != nil {
				t.Fatal(err)
			}
			w := writer{started: make(chan *Pacer, 1), err: make(chan error, 1)}
			a := Applier{Applier: w, Lane: tc.lane}
			// Asked by the pacer once a holder is ahead of the layer: the
			// layer is then past its first check and paused.
			var asked atomic.Int32
			a.Waited = func(t *Ticket) bool {
				asked.Add(1)
				return tc.waited && t == TicketOf(tc.layer)
			}
			applied := make(chan struct{})
			go func() {
				defer close(applied)
				_, _ = a.Apply(tc.layer, ocispec.Descriptor{}, nil)
			}()
			p := <-w.started
			if (p == nil) != tc.noPacer {
				t.Fatalf("pacer %v, want none: %v", p, tc.noPacer)
			}
			if tc.paused {
				// Waiting, and for the holder only. Released only once the
				// layer is paused, or it might never pause at all.
				await.Until(t, 10*time.Second, "the layer to give way", func() bool { return asked.Load() > 0 })
				release()
			}
			if err := <-w.err; err != nil {
				t.Fatal(err)
			}
			<-applied
			if !tc.paused {
				release()
			}
			if got := p.Paused() > 0; got != tc.paused {
				t.Fatalf("paused %v, want %v", p.Paused(), tc.paused)
			}
			if tc.lane.running != 0 || tc.lane.extra != 0 {
				t.Fatalf("places left: running %d, extra %d", tc.lane.running, tc.lane.extra)
			}
		})
	}

	t.Run("cancelled while paused", func(t *testing.T) {
		l := Overtaking(2, time.Second)
		release, err := l.Acquire(small)
		if err != nil {
			t.Fatal(err)
		}
		defer release()
		ctx, cancel := context.WithCancel(big)
		w := writer{started: make(chan *Pacer, 1), err: make(chan error, 1)}
		applied := make(chan error)
		go func() {
			_, err := Applier{Applier: w, Lane: l}.Apply(ctx, ocispec.Descriptor{}, nil)
			applied <- err
		}()
		<-w.started
		cancel()
		if err := <-applied; !errors.Is(err, context.Canceled) {
			t.Fatalf("apply: %v, want cancelled", err)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.running != 1 {
			t.Fatalf("running %d after the cancelled layer, want the holder's 1", l.running)
		}
	})
}

// TestOvertakingOnRelease: work that found the extra places taken gets one
// as soon as one is given back, not when the large holder is done.
func TestOvertakingOnRelease(t *testing.T) {
	due := dueFrom(time.Now())
	l := Overtaking(1, time.Second)
	bigDone, err := l.Acquire(due(1700 << 20))
	if err != nil {
		t.Fatal(err)
	}
	defer bigDone()
	firstDone, err := l.Acquire(due(20 << 20)) // the extra place
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func())
	go func() {
		r, err := l.Acquire(due(30 << 20))
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	await.Until(t, 10*time.Second, "the third pull to wait", func() bool { return l.Waiting() == 1 })
	firstDone()
	select {
	case r := <-got:
		r()
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting for the large holder with an extra place free")
	}
}
