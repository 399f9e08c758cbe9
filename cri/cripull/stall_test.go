package cripull

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/transfer"
)

func TestWatchStall(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		// run drives the watch and reports whether the pull context must
		// have been cancelled for a stall.
		run func(t *testing.T, ctx context.Context, w *stallWatch) (stalled bool)
	}{
		{
			name:    "no progress cancels the pull",
			timeout: 50 * time.Millisecond,
			run: func(t *testing.T, ctx context.Context, w *stallWatch) bool {
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("pull without progress was not cancelled")
				}
				return true
			},
		},
		{
			name:    "progress stops after a while",
			timeout: 50 * time.Millisecond,
			run: func(t *testing.T, ctx context.Context, w *stallWatch) bool {
				for i := 0; i < 5; i++ {
					w.progress(transfer.Progress{Event: "downloading"})
					if err := ctx.Err(); err != nil {
						t.Fatalf("cancelled while progressing: %v", context.Cause(ctx))
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("pull that stopped progressing was not cancelled")
				}
				return true
			},
		},
		{
			name:    "steady progress keeps the pull alive",
			timeout: 100 * time.Millisecond,
			run: func(t *testing.T, ctx context.Context, w *stallWatch) bool {
				tick := time.NewTicker(10 * time.Millisecond)
				defer tick.Stop()
				end := time.After(200 * time.Millisecond)
				for {
					select {
					case <-tick.C:
						w.progress(transfer.Progress{Event: "downloading", Progress: 1, Total: 2})
						if err := ctx.Err(); err != nil {
							t.Fatalf("pull with progress cancelled: %v", context.Cause(ctx))
						}
					case <-end:
						w.progress(transfer.Progress{Event: "downloading"})
						if err := ctx.Err(); err != nil {
							t.Fatalf("pull with progress cancelled: %v", context.Cause(ctx))
						}
						return false
					}
				}
			},
		},
		{
			name:    "zero timeout never fires",
			timeout: 0,
			run: func(t *testing.T, ctx context.Context, w *stallWatch) bool {
				select {
				case <-ctx.Done():
					t.Fatalf("pull cancelled with the watchdog off: %v", context.Cause(ctx))
				case <-time.After(100 * time.Millisecond):
				}
				w.progress(transfer.Progress{Event: "downloading"})
				return false
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent, cancelParent := context.WithCancel(context.Background())
			defer cancelParent()
			ctx, w, stop := watchStall(parent, tc.timeout)
			defer stop()

			stalled := tc.run(t, ctx, w)
			cause := context.Cause(ctx)
			if !stalled {
				if ctx.Err() != nil {
					t.Fatalf("pull cancelled: %v", cause)
				}
				return
			}
			if !errors.Is(cause, context.DeadlineExceeded) {
				t.Errorf("cause %v does not wrap context.DeadlineExceeded", cause)
			}
			if errors.Is(cause, context.Canceled) {
				t.Errorf("cause %v reads as a plain cancellation", cause)
			}
			if !strings.Contains(cause.Error(), "image_pull_progress_timeout") {
				t.Errorf("cause %q does not name image_pull_progress_timeout", cause)
			}
			if parent.Err() != nil {
				t.Error("the stall cancelled the caller's context")
			}
		})
	}
}

func TestWatchStallStop(t *testing.T) {
	for _, timeout := range []time.Duration{0, 50 * time.Millisecond, time.Hour} {
		t.Run(timeout.String(), func(t *testing.T) {
			ctx, w, stop := watchStall(context.Background(), timeout)
			w.progress(transfer.Progress{Event: "downloading"})
			stop()
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("stop did not cancel the pull context")
			}
			if cause := context.Cause(ctx); cause != context.Canceled {
				t.Errorf("cause after stop = %v, want context.Canceled", cause)
			}
			// Events may still arrive after the transfer returned.
			w.progress(transfer.Progress{Event: "complete"})
			stop()
			if cause := context.Cause(ctx); cause != context.Canceled {
				t.Errorf("cause after a late event = %v, want context.Canceled", cause)
			}
		})
	}
}

func TestWatchStallParentCancel(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	ctx, _, stop := watchStall(parent, time.Hour)
	defer stop()
	cancel()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("cancelling the caller did not cancel the pull")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
		t.Errorf("cause = %v, want context.Canceled", cause)
	}
}
