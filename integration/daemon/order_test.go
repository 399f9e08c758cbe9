package daemon

import (
	"slices"
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
