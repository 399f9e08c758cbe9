package pinning

import (
	"context"
	"fmt"
	"testing"

	"github.com/opencontainers/go-digest"
)

// BenchmarkReconcileStore: the cost of one full pass (nothing to change),
// and of deciding whether an image event needs one, in a store of N
// images. A pass grows linearly with the store; a decision does not grow.
func BenchmarkReconcileStore(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		s := newTestStore(b)
		s.create(b, record{name: pause310, target: pauseManifest})
		for i := range n {
			s.create(b, record{name: fmt.Sprintf("%s/app%d:v1", reg, i), target: digest.FromString(fmt.Sprint(i))})
		}
		pins, err := NewPins(map[string]string{"sandbox": pause310})
		if err != nil {
			b.Fatal(err)
		}
		r := NewReconciler(s, pins)
		ctx := context.Background()
		if _, err := r.Reconcile(ctx); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("pass/images=%d", n), func(b *testing.B) {
			for b.Loop() {
				if _, err := r.Reconcile(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("event/images=%d", n), func(b *testing.B) {
			name := fmt.Sprintf("%s/app%d:v1", reg, n/2)
			for b.Loop() {
				if r.concerns(ctx, name) {
					b.Fatal("an unrelated image concerns pins")
				}
			}
		})
	}
}
