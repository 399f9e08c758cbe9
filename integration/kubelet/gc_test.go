package kubelet

import (
	"testing"
	"time"
)

// gcTimeout bounds the wait for kubelet's image GC. kubelet runs it when it
// starts and then every 5 minutes (ImageGCPeriod, not configurable); when
// its first run comes before the image filesystem stats are ready, the
// next one is 5 minutes later.
const gcTimeout = 6 * time.Minute

// TestKubeletImageGC: kubelet's image GC, with thresholds that make it
// free everything it may, removes an unused image and keeps the pinned
// sandbox image.
func TestKubeletImageGC(t *testing.T) {
	n := newNode(t, nodeOptions{
		kubelet: Options{Config: map[string]any{
			// Any usage is above 1%: GC frees all it can, down to 0%.
			"imageGCHighThresholdPercent": 1,
			"imageGCLowThresholdPercent":  0,
			"imageMinimumGCAge":           "0s",
		}},
		prePullPause: true,
		prePull:      []string{"gc/unused:v1"},
	})
	unused := n.prePulled["gc/unused:v1"]
	deadline := time.Now().Add(gcTimeout)
	start := time.Now()
	for n.imageStatus(unused).GetImage() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("kubelet's image GC did not remove the unused image %s within %s:\n%s", unused, gcTimeout, n.k.LogTail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("kubelet removed the unused image %s after %s", unused, time.Since(start).Round(time.Millisecond))
	img := n.imageStatus(n.pause.Ref).GetImage()
	if img == nil || !img.GetPinned() {
		t.Fatalf("the pinned sandbox image did not survive kubelet's image GC: %v", img)
	}
	// kubelet skipped it because CRI reports it pinned; it did not try and
	// get refused by protect_pinned_images.
	if tried := n.k.LogLines("Removing image", img.GetId()); len(tried) > 0 {
		t.Errorf("kubelet tried to remove the pinned sandbox image: %v", tried)
	}
	// What kubelet said about it, for the record (docs/kubelet.md).
	for _, l := range n.k.LogLines("arbage collection") {
		t.Log(l)
	}
	for _, l := range n.k.LogLines("image_gc_manager") {
		t.Log(l)
	}
}
