package lane

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pullwise/pullwise/internal/await"
)

// contended is a Pressure whose CPUs are always contended, or never.
func contended(yes bool) *Pressure {
	f := &fakePressure{clock: fakeClock{t: time.Now()}}
	p := f.pressure()
	p.contended, p.at = yes, time.Now().Add(time.Hour) // never read again
	return p
}

// TestInFlightBehind: work gives way to a pull in flight due more than the
// slack before it while the CPUs are contended, and only then; a pull is
// Ahead whatever the CPUs.
func TestInFlightBehind(t *testing.T) {
	now := time.Now()
	big := func() *Ticket { tk := NewTicket(now); tk.Need(costOf(1700 << 20)); return tk }
	small := func() *Ticket { tk := NewTicket(now); tk.Need(costOf(20 << 20)); return tk }
	late := func() *Ticket { tk := NewTicket(now.Add(-time.Minute)); tk.Need(costOf(1700 << 20)); return tk }
	// lending: a large pull holding a lock a small pull waits on
	// (KeyedLock), which lends it the small pull's due.
	lending := func() *Ticket { return lends(big(), small().Due()) }
	between := func() *Ticket { tk := NewTicket(now); tk.Need(costOf(500 << 20)); return tk }
	cases := []struct {
		name      string
		cpu       *Pressure
		mine      *Ticket
		inFlight  []*Ticket
		doneFirst bool // the other pulls end before the question
		want      bool
		ahead     bool // Ahead's answer, where it differs from want
	}{
		{name: "behind a small pull, CPUs contended", cpu: contended(true), mine: big(), inFlight: []*Ticket{small()}, want: true},
		{name: "CPUs free", cpu: contended(false), mine: big(), inFlight: []*Ticket{small()}, ahead: true},
		{name: "no pressure to read", mine: big(), inFlight: []*Ticket{small()}, ahead: true},
		{name: "a small pull never waits for a large one", cpu: contended(true), mine: small(), inFlight: []*Ticket{big()}},
		{name: "within the slack", cpu: contended(true), mine: small(), inFlight: []*Ticket{small()}},
		{name: "alone", cpu: contended(true), mine: big()},
		{name: "the pull ahead is over", cpu: contended(true), mine: big(), inFlight: []*Ticket{small()}, doneFirst: true},
		{name: "a late pull gives way to nobody", cpu: contended(true), mine: late(), inFlight: []*Ticket{small()}},
		{name: "work without a ticket is not paced", cpu: contended(true), inFlight: []*Ticket{small()}},
		{name: "a lending pull is seen at its own due", cpu: contended(true), mine: between(), inFlight: []*Ticket{lending()}},
		{name: "a lending pull gives way by the due it lends", cpu: contended(true), mine: lending(), inFlight: []*Ticket{between()}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := NewInFlight(tc.cpu, Slack)
			defer f.Add(tc.mine)()
			for _, o := range tc.inFlight {
				done := f.Add(o)
				if tc.doneFirst {
					done()
				} else {
					defer done()
				}
			}
			if got := f.Behind(tc.mine, tc.mine.DueOr(now)); got != tc.want {
				t.Fatalf("Behind() = %v, want %v", got, tc.want)
			}
			if got := f.Ahead(tc.mine, tc.mine.DueOr(now)); got != (tc.want || tc.ahead) {
				t.Fatalf("Ahead() = %v, want %v", got, tc.want || tc.ahead)
			}
		})
	}

	t.Run("added twice, counted until both are done", func(t *testing.T) {
		f := NewInFlight(contended(true), Slack)
		s, b := small(), big()
		done1, done2 := f.Add(s), f.Add(s)
		done1()
		if !f.Behind(b, b.Due()) {
			t.Fatal("not behind a pull still in flight once")
		}
		done2()
		if f.Behind(b, b.Due()) {
			t.Fatal("behind a pull no longer in flight")
		}
	})
}

// TestInFlightPacesLayers: a large pull's layer gives way to a small pull
// in flight while the CPUs are contended, though a place is left for it,
// and goes on when the small pull is over; a body on the link too.
func TestInFlightPacesLayers(t *testing.T) {
	now := time.Now()
	due := dueFrom(now)
	f := NewInFlight(contended(true), Slack)

	l := Overtaking(2, time.Second)
	l.GiveWay(f)
	big := due(1700 << 20)
	p, w, applied := applyPaced(big, l)
	done := f.Add(TicketOf(due(20 << 20)))
	close(w.proceed)
	await.Until(t, 10*time.Second, "the layer to give way", p.pausing.Load)

	link := NewLink(time.Second)
	link.GiveWay(f)
	body := link.Open(big, nil)
	defer body.Close()
	if !body.Behind() {
		t.Fatal("the large pull's body does not give way to the small pull in flight")
	}

	done()
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if p.Paused() == 0 {
		t.Fatal("the layer never paused")
	}
	if body.Behind() {
		t.Fatal("the body still gives way with no pull ahead in flight")
	}
}

// TestPacerWrittenEarly: a layer written while its blob arrives gives way
// to a pull ahead in flight though no task waits for a CPU, and goes on
// when that pull is over; a layer written after its last byte does not.
func TestPacerWrittenEarly(t *testing.T) {
	now := time.Now()
	due := dueFrom(now)
	for _, tc := range []struct {
		name  string
		early bool
	}{
		{"written early", true},
		{"written after its last byte", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewInFlight(contended(false), Slack)
			l := Overtaking(2, Slack)
			l.GiveWay(f)
			layer := due(1700 << 20)
			if tc.early {
				layer = WrittenEarly(layer, func() time.Duration { return 0 })
			}
			p, w, applied := applyPaced(layer, l)
			done := f.Add(TicketOf(due(20 << 20)))
			close(w.proceed)
			if tc.early {
				await.Until(t, 10*time.Second, "the layer to give way", p.pausing.Load)
			}
			done()
			if err := <-applied; err != nil {
				t.Fatal(err)
			}
			if paused := p.Paused() > 0; paused != tc.early {
				t.Fatalf("paused %v with the CPUs free, want a pause: %v", p.Paused(), tc.early)
			}
		})
	}
}

// TestPauseKeepsNoPlaceWorkAheadWaitsFor: a layer giving way to a pull
// ahead in flight goes on once work ahead of it waits for a place, since
// its pause would keep the place that work waits for.
func TestPauseKeepsNoPlaceWorkAheadWaitsFor(t *testing.T) {
	now := time.Now()
	due := dueFrom(now)
	f := NewInFlight(contended(true), Slack)
	defer f.Add(TicketOf(due(20 << 20)))()
	l := Overtaking(1, Slack)
	l.GiveWay(f)

	p, w, applied := applyPaced(due(1700<<20), l)
	close(w.proceed)
	await.Until(t, 10*time.Second, "the layer to give way", p.pausing.Load)

	// A small layer takes the one extra place; the next waits in line.
	releaseExtra, err := l.Acquire(due(20 << 20))
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan func(), 1)
	go func() {
		release, err := l.Acquire(due(30 << 20))
		if err != nil {
			t.Error(err)
			release = func() {}
		}
		granted <- release
	}()
	select {
	case err := <-applied:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the layer still gave way while a layer ahead of it waited for its place")
	}
	releaseExtra()
	(<-granted)()
	if p.Paused() == 0 {
		t.Fatal("the layer never paused")
	}
}

// TestInFlightYield: work that only moves earlier waits while a pull due
// before it is in flight, whatever the CPUs, and goes on when it is over.
func TestInFlightYield(t *testing.T) {
	now := time.Now()
	due := dueFrom(now)
	f := NewInFlight(contended(false), Slack)
	big := due(1700 << 20)
	if err := f.Yield(big); err != nil {
		t.Fatalf("alone: %v", err)
	}
	done := f.Add(TicketOf(due(20 << 20)))
	yielded := make(chan error, 1)
	go func() { yielded <- f.Yield(big) }()
	select {
	case err := <-yielded:
		t.Fatalf("did not wait for the small pull in flight: %v", err)
	case <-time.After(5 * poll):
	}
	done()
	if err := <-yielded; err != nil {
		t.Fatal(err)
	}

	defer f.Add(TicketOf(due(20 << 20)))()
	ctx, cancel := context.WithCancel(big)
	cancel()
	if err := f.Yield(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	var nilFlight *InFlight
	if err := nilFlight.Yield(big); err != nil {
		t.Fatalf("nil InFlight: %v", err)
	}
}
