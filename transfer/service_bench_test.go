package transfer

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/transfer/gate"
)

// BenchmarkPullOverhead is what Pullwise's own path costs a pull beside
// containerd's: the dedupe key, the pull list, the hub, the gate and the
// metrics, with a containerd stand-in that returns at once. "bare" calls
// the stand-in directly. Each op is a burst of concurrent pulls of
// different images: the ns/pull metric should not grow with the burst.
func BenchmarkPullOverhead(b *testing.B) {
	for _, pulls := range []int{1, 20, 200} {
		for _, path := range []string{"bare", "pullwise"} {
			b.Run(fmt.Sprintf("%s/pulls=%d", path, pulls), func(b *testing.B) {
				next := &fakeNext{}
				s, err := New(next, Local{}, prometheus.NewRegistry())
				if err != nil {
					b.Fatal(err)
				}
				s.Configure(Config{Gate: gate.New(3, 0)})
				t := s.Transfer
				if path == "bare" {
					t = next.Transfer
				}
				srcs := make([]fakeSource, pulls)
				dsts := make([]fakeDest, pulls)
				for i := range srcs {
					srcs[i] = fakeSource{ref: fmt.Sprintf("example.com/app%d:v1", i)}
					dsts[i] = fakeDest{name: srcs[i].ref}
				}
				ctx := context.Background()
				for b.Loop() {
					var wg sync.WaitGroup
					for i := range pulls {
						wg.Add(1)
						go func() {
							defer wg.Done()
							if err := t(ctx, srcs[i], dsts[i]); err != nil {
								b.Error(err)
							}
						}()
					}
					wg.Wait()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*pulls), "ns/pull")
			})
		}
	}
}
