package hub

import (
	"fmt"
	"testing"

	"github.com/containerd/containerd/v2/core/transfer"
)

// BenchmarkUpdateFanout is the CPU time one progress event costs the pull
// that reports it, with N subscribers open on the node: each watches its
// own pod, and one in ten watches the pulling pod. The cost grows with
// subscribers (each selector is asked), never with how fast they read.
func BenchmarkUpdateFanout(b *testing.B) {
	for _, subs := range []int{0, 100, 1000} {
		b.Run(fmt.Sprintf("subscribers=%d", subs), func(b *testing.B) {
			var h Hub
			h.Join("pull", "example.com/app:v1", "pod-0")
			for i := range subs {
				pod := fmt.Sprintf("pod-%d", i%10)
				s := h.Subscribe(forPod(pod))
				b.Cleanup(s.Close)
			}
			ev := transfer.Progress{Event: "downloading", Name: "layer-sha256:aa", Total: 1 << 30}
			for i := 0; b.Loop(); i++ {
				ev.Progress = int64(i)
				h.Update("pull", ev)
			}
		})
	}
}
