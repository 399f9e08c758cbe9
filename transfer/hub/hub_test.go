package hub

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/containerd/containerd/v2/core/transfer"
)

func all(Pull) bool { return true }

func forPod(uid string) Selector {
	return func(p Pull) bool {
		for _, u := range p.Pods {
			if u == uid {
				return true
			}
		}
		return false
	}
}

func dl(layer string, done, total int64) transfer.Progress {
	return transfer.Progress{Event: "downloading", Name: "layer-" + layer, Progress: done, Total: total}
}

func TestLayerLinesThenImageLine(t *testing.T) {
	var h Hub
	h.Join("k", "example.com/app:v1", "pod-a")
	s := h.Subscribe(forPod("pod-a"))
	defer s.Close()
	h.Update("k", transfer.Progress{Event: "waiting", Name: "layer-sha256:a", Total: 100})
	h.Update("k", dl("sha256:a", 40, 100))
	h.Update("k", transfer.Progress{Event: "downloading", Name: "manifest-sha256:m", Progress: 1, Total: 2}) // not a layer
	h.Update("k", transfer.Progress{Event: "already exists", Name: "layer-sha256:b"})
	lines, over := s.Take()
	if over {
		t.Fatal("over while the pull runs")
	}
	// The image line of the initial state, then the two layers at their
	// latest state.
	want := []Event{
		{Image: "example.com/app:v1"},
		{Image: "example.com/app:v1", Layer: "sha256:a", Progress: 40, Total: 100},
		{Image: "example.com/app:v1", Layer: "sha256:b"},
	}
	if fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Fatalf("lines\n%v\nwant\n%v", lines, want)
	}
	h.Finish("k", nil)
	lines, over = s.Take()
	if !over {
		t.Fatal("not over after the pull finished")
	}
	last := lines[len(lines)-1]
	if last.Layer != "" || last.Progress != 100 || last.Total != 100 {
		t.Fatalf("final image line %+v", last)
	}
	for _, l := range lines[:len(lines)-1] {
		if l.Progress != l.Total {
			t.Fatalf("layer not complete at the end: %+v", l)
		}
	}
}

func TestProgressNeverGoesBack(t *testing.T) {
	var h Hub
	h.Join("k", "img", "")
	s := h.Subscribe(all)
	defer s.Close()
	h.Update("k", dl("sha256:a", 60, 100))
	h.Update("k", dl("sha256:a", 30, 100)) // a resumed fetch restarting its count
	lines, _ := s.Take()
	if got := lines[len(lines)-1]; got.Progress != 60 {
		t.Fatalf("progress went back: %+v", got)
	}
}

func TestLateJoinGetsCurrentState(t *testing.T) {
	var h Hub
	h.Join("k", "img", "pod")
	h.Update("k", dl("sha256:a", 10, 100))
	h.Update("k", dl("sha256:a", 70, 100))
	s := h.Subscribe(forPod("pod"))
	defer s.Close()
	select {
	case <-s.Ready():
	default:
		t.Fatal("late subscriber not ready with the current state")
	}
	lines, _ := s.Take()
	if len(lines) != 2 || lines[0].Progress != 70 || lines[1].Layer != "" {
		t.Fatalf("late join got %v", lines)
	}
}

func TestFailureEndsWithError(t *testing.T) {
	var h Hub
	h.Join("k", "img", "pod")
	s := h.Subscribe(forPod("pod"))
	defer s.Close()
	h.Update("k", dl("sha256:a", 10, 100))
	h.Finish("k", errors.New("context canceled"))
	lines, over := s.Take()
	last := lines[len(lines)-1]
	if !over || last.Error != "context canceled" || last.Layer != "" {
		t.Fatalf("final %+v over=%v", last, over)
	}
	if lines[len(lines)-2].Progress != 10 {
		t.Fatalf("a failed layer was reported complete: %+v", lines[len(lines)-2])
	}
}

func TestOtherPodsPullsAreNotSeen(t *testing.T) {
	var h Hub
	h.Join("k1", "img1", "pod-a")
	h.Join("k2", "img2", "pod-b")
	s := h.Subscribe(forPod("pod-a"))
	defer s.Close()
	h.Update("k2", dl("sha256:b", 1, 2))
	lines, _ := s.Take()
	for _, l := range lines {
		if l.Image != "img1" {
			t.Fatalf("pod-a saw %+v", l)
		}
	}
}

// A subscriber that never reads neither blocks pulls nor grows: it holds
// one line per layer.
func TestStuckSubscriberNeverBlocks(t *testing.T) {
	var h Hub
	h.Join("k", "img", "")
	stuck := h.Subscribe(all)
	defer stuck.Close()
	var wg sync.WaitGroup
	for l := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range int64(10000) {
				h.Update("k", dl(fmt.Sprintf("sha256:%d", l), i, 10000))
			}
		}()
	}
	wg.Wait()
	stuck.mu.Lock()
	n := len(stuck.pending)
	stuck.mu.Unlock()
	if n != 11 {
		t.Fatalf("stuck subscriber holds %d lines, want one per layer plus the image", n)
	}
}

func TestCloseStopsDelivery(t *testing.T) {
	var h Hub
	h.Join("k", "img", "")
	s := h.Subscribe(all)
	s.Take()
	s.Close()
	h.Update("k", dl("sha256:a", 1, 2))
	if lines, _ := s.Take(); len(lines) != 0 {
		t.Fatalf("closed subscription got %v", lines)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) != 0 {
		t.Fatal("subscription still registered")
	}
}

func TestFinishedPullIsForgotten(t *testing.T) {
	var h Hub
	h.Join("k", "img", "pod")
	h.Finish("k", nil)
	h.Leave("k", "pod")
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.pulls) != 0 {
		t.Fatal("finished pull kept")
	}
}

func TestDownloadedBytesMoveLayers(t *testing.T) {
	var h Hub
	h.Join("k", "img", "")
	s := h.Subscribe(all)
	defer s.Close()
	if _, ok := h.Downloaded("k", "sha256:cfg", 10); ok {
		t.Fatal("a blob that is not a known layer moved")
	}
	h.Update("k", transfer.Progress{Event: "waiting", Name: "layer-sha256:a", Total: 100})
	h.Downloaded("k", "sha256:a", 30)
	e, _ := h.Downloaded("k", "sha256:a", 30)
	if e.Progress != 60 {
		t.Fatalf("progress %d after 60 bytes", e.Progress)
	}
	e, _ = h.Downloaded("k", "sha256:a", 500) // a retried range counts twice
	if e.Progress != 100 {
		t.Fatalf("progress %d, want capped at the total", e.Progress)
	}
	h.Update("k", transfer.Progress{Event: "extracting", Name: "layer-sha256:b", Progress: 5, Total: 50})
	lines, _ := s.Take()
	if got := lines[len(lines)-1]; got.Layer != "sha256:b" || got.Progress != 5 {
		t.Fatalf("extracting counted as done: %+v", got)
	}
}

// A layer a remote snapshotter mounted is done at once and says lazy;
// other layers' lines keep exactly KEP-5334's keys.
func TestLazyLayerLine(t *testing.T) {
	var h Hub
	h.Join("k", "example.com/app:v1", "")
	s := h.Subscribe(all)
	defer s.Close()
	h.Update("k", transfer.Progress{Event: EventLazy, Name: "layer-sha256:a", Progress: 100, Total: 100})
	h.Update("k", dl("sha256:b", 10, 50))
	lines, _ := s.Take()
	want := []Event{
		{Image: "example.com/app:v1"},
		{Image: "example.com/app:v1", Layer: "sha256:a", Progress: 100, Total: 100, State: StateLazy},
		{Image: "example.com/app:v1", Layer: "sha256:b", Progress: 10, Total: 50},
	}
	if fmt.Sprint(lines) != fmt.Sprint(want) {
		t.Fatalf("lines\n%v\nwant\n%v", lines, want)
	}
}
