package lane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/await"
)

// writer is a layer applier whose layer waits on its pacer, as the gzip
// reader does before every Read.
// It writes once told to go on (nil: at once), so that a test can fill
// the lane around it first.
type writer struct {
	diff.Applier
	started chan *Pacer
	proceed chan struct{}
	err     chan error
}

func newWriter() writer {
	return writer{started: make(chan *Pacer, 1), proceed: make(chan struct{}), err: make(chan error, 1)}
}

func (w writer) Apply(ctx context.Context, _ ocispec.Descriptor, _ []mount.Mount, _ ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	p := PacerOf(ctx)
	w.started <- p
	<-w.proceed
	err := p.Wait(ctx)
	w.err <- err
	return ocispec.Descriptor{}, err
}

// applyPaced starts applying ctx's layer in l through a writer and
// returns, once the layer holds a place, its Pacer, the writer (close its
// proceed to let the layer read on) and what Apply returns.
func applyPaced(ctx context.Context, l *Lane) (*Pacer, writer, <-chan error) {
	w := newWriter()
	applied := make(chan error, 1)
	go func() {
		_, err := Applier{Applier: w, Lane: l}.Apply(ctx, ocispec.Descriptor{}, nil)
		applied <- err
	}()
	return <-w.started, w, applied
}

// dueFrom returns the context of a pull of bytes asked for at base.
func dueFrom(base time.Time) func(bytes int64) context.Context {
	return func(bytes int64) context.Context {
		tk := NewTicket(base)
		tk.Need(costOf(bytes))
		return WithTicket(context.Background(), tk)
	}
}

// TestPacer: a layer being written gives way while layers of pulls due
// more than the slack before it fill every place, and only then: not with
// a place left for it, not once late, and not while a pull due before
// the holder waits on a lock its pull holds. Cancelling it while it waits
// frees its place.
func TestPacer(t *testing.T) {
	now := time.Now()
	due := dueFrom(now)
	big, small := due(1700<<20), due(20<<20)
	// Asked for 20 s ago: due 3 s ago, and so late; the small pull due
	// 2 s before it.
	late := dueFrom(now.Add(-20 * time.Second))(1700 << 20)
	earlier := dueFrom(now.Add(-20 * time.Second))(1500 << 20)
	cases := []struct {
		name    string
		lane    *Lane
		holder  context.Context // holds a place while the layer starts
		layer   context.Context
		paused  bool // the layer waits until the holder is done
		noPacer bool
		lent    bool // a pull due before the holder waits on a lock the layer's pull holds
	}{
		{name: "large layer gives way to a small pull's", lane: Overtaking(1, time.Second), holder: small, layer: big, paused: true},
		{name: "not while a place is left for it", lane: Overtaking(2, time.Second), holder: small, layer: big},
		{name: "small layer does not give way to a large pull's", lane: Overtaking(1, time.Second), holder: big, layer: small},
		{name: "within the slack", lane: Overtaking(1, time.Second), holder: due(40 << 20), layer: due(120 << 20)},
		{name: "a plain lane never paces", lane: New(1), holder: small, layer: big, noPacer: true},
		{name: "a late pull gives way to nobody", lane: Overtaking(1, time.Second), holder: earlier, layer: late},
		{name: "not while an earlier pull waits on it", lane: Overtaking(1, time.Second), holder: small, layer: big, lent: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.lent {
				k := NewKeyedLock(tc.lane)
				if err := k.Lock(tc.layer, "chain"); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(dueFrom(time.Now().Add(-time.Minute))(1 << 20))
				waited := make(chan error, 1)
				go func() { waited <- k.Lock(ctx, "chain") }()
				defer func() {
					cancel()
					<-waited
					k.Unlock("chain")
				}()
				await.Until(t, 10*time.Second, "the waiter to lend its due", func() bool { return TicketOf(tc.layer).Due().Before(TicketOf(small).Due()) })
			}
			w := newWriter()
			a := Applier{Applier: w, Lane: tc.lane}
			applied := make(chan struct{})
			go func() {
				defer close(applied)
				_, _ = a.Apply(tc.layer, ocispec.Descriptor{}, nil)
			}()
			p := <-w.started
			if (p == nil) != tc.noPacer {
				t.Fatalf("pacer %v, want none: %v", p, tc.noPacer)
			}
			release := hold(tc.lane, tc.holder)
			close(w.proceed)
			if tc.paused {
				// Released only once the layer is paused, or it might
				// never pause at all.
				await.Until(t, 10*time.Second, "the layer to give way", p.pausing.Load)
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
			if tc.lane.running != 0 || tc.lane.extra.Taken() != 0 {
				t.Fatalf("places left: running %d, extra %d", tc.lane.running, tc.lane.extra.Taken())
			}
		})
	}

	t.Run("cancelled while paused", func(t *testing.T) {
		l := Overtaking(1, time.Second)
		ctx, cancel := context.WithCancel(big)
		p, w, applied := applyPaced(ctx, l)
		release := hold(l, small)
		defer release()
		close(w.proceed)
		await.Until(t, 10*time.Second, "the layer to give way", p.pausing.Load)
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

// hold gives ctx's work a place in l beside what holds places already, as
// work that overtook would hold, and returns the func that gives it back.
func hold(l *Lane, ctx context.Context) func() {
	t := TicketOf(ctx)
	l.mu.Lock()
	h := l.take(t, t.DueOr(time.Now()), l.holders != nil, "")
	l.mu.Unlock()
	return l.releaser(h)
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
