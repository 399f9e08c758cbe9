package gate

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pullwise/pullwise/transfer/lane"
)

// TestHandback plays pulls' events through a hand back of limit 1 and
// checks which slots were given back after each, in order.
func TestHandback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int
		events string // "f2" pull 2 fetched, "d2" pull 2 done
		want   []string
	}{
		{"the first fetched gives its slot back at once", 1, "f1", []string{"1"}},
		{"the second keeps it until the first is done", 1, "f1 f2", []string{"1", "1"}},
		{"then gives it back", 1, "f1 f2 d1", []string{"1", "1", "1 2"}},
		{"held ones follow in fetch order", 1, "f1 f3 f2 d1 d3", []string{"1", "1", "1", "1 3", "1 3 2"}},
		{"a held pull that ends leaves the line", 1, "f1 f2 f3 d2 d1", []string{"1", "1", "1", "1", "1 3"}},
		{"a pull that ends before its blobs are in changes nothing", 1, "d1 f2", []string{"", "2"}},
		{"fetched after its end: nothing held", 1, "f1 d2 f2 d1 f3", []string{"1", "1", "1", "1", "1 3"}},
		{"a limit of two", 2, "f1 f2 f3 d2", []string{"1", "1 2", "1 2", "1 2 3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHandback(tc.limit, 0)
			var (
				mu       sync.Mutex
				released []string
			)
			turns := map[string]*Hold{}
			turn := func(id string) *Hold {
				if turns[id] == nil {
					turns[id] = h.Start(nil)
				}
				return turns[id]
			}
			var got []string
			for _, ev := range strings.Fields(tc.events) {
				id := ev[1:]
				switch ev[0] {
				case 'f':
					turn(id).Fetched(func() {
						mu.Lock()
						defer mu.Unlock()
						if slices.Contains(released, id) {
							t.Errorf("slot of %s given back twice", id)
						}
						released = append(released, id)
					})
				case 'd':
					turn(id).Done()
				}
				mu.Lock()
				got = append(got, strings.Join(released, " "))
				mu.Unlock()
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("given back after each event: %q, want %q", got, tc.want)
			}
		})
	}
}

// TestHandbackConcurrent: pulls fetching and ending from many goroutines
// leave nothing held and every fetched slot given back exactly once.
func TestHandbackConcurrent(t *testing.T) {
	h := NewHandback(1, 0)
	var wg sync.WaitGroup
	given := make([]atomic.Int32, 200)
	for i := range given {
		wg.Go(func() {
			turn := h.Start(nil)
			turn.Fetched(func() { given[i].Add(1) })
			turn.Done()
		})
	}
	wg.Wait()
	for i := range given {
		if n := given[i].Load(); n > 1 {
			t.Errorf("slot of pull %d given back %d times", i, n)
		}
	}
	if h.Held() != 0 {
		t.Fatalf("%d pulls still held", h.Held())
	}
	// The hand back is free again: the next fetched pull goes at once.
	next := false
	h.Start(nil).Fetched(func() { next = true })
	if !next {
		t.Fatal("the next pull kept its slot after every pull ended")
	}
}

// TestNoHandback: without a hand back every fetched pull gives its slot
// back at once.
func TestNoHandback(t *testing.T) {
	var h *Handback
	given := 0
	for range 3 {
		turn := h.Start(nil)
		turn.Fetched(func() { given++ })
		defer turn.Done()
	}
	if given != 3 {
		t.Fatalf("%d of 3 slots given back", given)
	}
}

// TestHandbackOvertaking: with a large pull unpacking without its slot, a
// small pull asked for with it gives its slot back too, and so does one
// more, up to the limit beyond it; a pull due about as late as the large
// one keeps its slot; and when a small one ends, a held small one goes.
func TestHandbackOvertaking(t *testing.T) {
	base := time.Now()
	due := func(bytes int64) *lane.Ticket {
		tk := lane.NewTicket(base)
		tk.Need(costOf(bytes))
		return tk
	}
	h := NewHandback(1, time.Second)
	given := map[string]bool{}
	fetch := func(name string, tk *lane.Ticket) *Hold {
		turn := h.Start(tk)
		turn.Fetched(func() { given[name] = true })
		return turn
	}
	big := fetch("big", due(1700<<20))
	small1 := fetch("small1", due(20<<20))
	large2 := fetch("large2", due(1650<<20))
	small2 := fetch("small2", due(30<<20))
	want := map[string]bool{"big": true, "small1": true}
	if !maps.Equal(given, want) {
		t.Fatalf("given back: %v, want %v", given, want)
	}
	small1.Done()
	want["small2"] = true
	if !maps.Equal(given, want) {
		t.Fatalf("after small1 ended, given back: %v, want %v", given, want)
	}
	small2.Done()
	big.Done()
	want["large2"] = true
	if !maps.Equal(given, want) {
		t.Fatalf("after big ended, given back: %v, want %v", given, want)
	}
	large2.Done()
	if h.Held() != 0 || len(h.early) != 0 || h.extra.Taken() != 0 {
		t.Fatalf("left: %d held, %d early, %d extra", h.Held(), len(h.early), h.extra.Taken())
	}
}

// TestHandbackLate: a late pull gives its slot back beside the pull
// unpacking without its slot, though it is not due before it, and one
// not yet late keeps its slot.
func TestHandbackLate(t *testing.T) {
	asked := time.Now().Add(-time.Minute)
	due := func(cost time.Duration) *lane.Ticket {
		tk := lane.NewTicket(asked)
		tk.Need(cost)
		return tk
	}
	h := NewHandback(1, time.Second)
	given := map[string]bool{}
	fetch := func(name string, tk *lane.Ticket) *Hold {
		hold := h.Start(tk)
		hold.Fetched(func() { given[name] = true })
		return hold
	}
	first := fetch("first", due(17*time.Second))
	late := fetch("late", due(18*time.Second))
	notLate := fetch("not late", due(2*time.Minute))
	if want := map[string]bool{"first": true, "late": true}; !maps.Equal(given, want) {
		t.Fatalf("given back: %v, want %v", given, want)
	}
	for _, hold := range []*Hold{first, late, notLate} {
		hold.Done()
	}
	if h.Held() != 0 || len(h.early) != 0 || h.extra.Taken() != 0 {
		t.Fatalf("left: %d held, %d early, %d extra", h.Held(), len(h.early), h.extra.Taken())
	}
}
