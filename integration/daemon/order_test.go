package daemon

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestOrder(t *testing.T) {
	for _, tc := range []struct {
		names []string
		runs  int
	}{
		{[]string{"stock", "pullwise"}, 2},
		{[]string{"stock", "pullwise", "again"}, 6},
	} {
		// Over tc.runs bursts, each name goes first as often as any
		// other, and each pair goes each way round as often.
		first, before := map[string]int{}, map[[2]string]int{}
		for i := range tc.runs {
			o := Order(i, tc.names...)
			if !slices.Equal(slices.Sorted(slices.Values(o)), slices.Sorted(slices.Values(tc.names))) {
				t.Fatalf("Order(%d, %v) = %v, not the same names", i, tc.names, o)
			}
			first[o[0]]++
			for a := range o {
				for _, later := range o[a+1:] {
					before[[2]string{o[a], later}]++
				}
			}
		}
		for _, n := range tc.names {
			if first[n] != tc.runs/len(tc.names) {
				t.Errorf("%v: %s first in %d of %d bursts", tc.names, n, first[n], tc.runs)
			}
		}
		for pair, n := range before {
			if back := before[[2]string{pair[1], pair[0]}]; n != back {
				t.Errorf("%v: %s before %s in %d bursts, after in %d", tc.names, pair[0], pair[1], n, back)
			}
		}
	}
	// The first three bursts of three are the rotations: each first once.
	seen := map[string]bool{}
	for i := range 3 {
		seen[Order(i, "a", "b", "c")[0]] = true
	}
	if len(seen) != 3 {
		t.Errorf("in the first three bursts the first were %v, want each once", seen)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records its message and
// returns, so that a test can see what a helper refuses.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

func TestBurst(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    int
		refused bool
	}{
		{env: "", want: 0},
		{env: "0", want: 0},
		{env: "4", want: 4},
		{env: "-1", refused: true},
		{env: "two", refused: true},
	} {
		t.Setenv("PULLWISE_BENCH_BURST", tc.env)
		rec := &fatalRecorder{TB: t}
		got := Burst(rec)
		if tc.refused {
			if !strings.Contains(rec.msg, "PULLWISE_BENCH_BURST") {
				t.Errorf("PULLWISE_BENCH_BURST=%q: not refused (Burst gave %d)", tc.env, got)
			}
			continue
		}
		if rec.msg != "" || got != tc.want {
			t.Errorf("PULLWISE_BENCH_BURST=%q: Burst = %d (refusal %q), want %d", tc.env, got, rec.msg, tc.want)
		}
	}
}
