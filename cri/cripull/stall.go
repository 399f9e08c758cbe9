package cripull

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"
)

// stallWatch cancels a pull that reports no progress for
// image_pull_progress_timeout, as CRI does on both its paths; 0 turns it
// off. Progress is any event: Pullwise's transfer service reports bytes as
// they arrive, even while a layer is unpacked as it streams in.
type stallWatch struct {
	timeout time.Duration
	cancel  context.CancelCauseFunc
	mu      sync.Mutex
	timer   *time.Timer
}

func watchStall(ctx context.Context, timeout time.Duration) (context.Context, *stallWatch, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &stallWatch{timeout: timeout, cancel: cancel}
	if timeout > 0 {
		w.timer = time.AfterFunc(timeout, func() {
			cancel(fmt.Errorf("no progress for %s (image_pull_progress_timeout): %w", timeout, context.DeadlineExceeded))
		})
	}
	return ctx, w, func() {
		w.stop()
		cancel(nil)
	}
}

// progress is the pull's progress func: every event restarts the clock.
func (w *stallWatch) progress(transfer.Progress) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Reset(w.timeout)
	}
}

func (w *stallWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		w.timer.Stop()
		w.timer = nil
	}
}
