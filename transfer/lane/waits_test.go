package lane

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/pullwise/pullwise/internal/await"
)

// shared is something one pull holds and another waits for.
type shared struct {
	hold    func(ctx context.Context) (release func(), err error)
	wait    func(ctx context.Context) error // takes it, and gives it back
	waiting func() bool                     // whether a wait is in line for it
}

// TestWaitsSummedOnTheTicket: work that waits for another pull's lock, or
// for an unpack place, adds the wait to its own pull's ticket under the
// timeline's name, and the pull it waited for has none.
func TestWaitsSummedOnTheTicket(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func() shared
		want string
	}{
		{"lock", func() shared {
			k := NewKeyedLock()
			return shared{
				hold: func(ctx context.Context) (func(), error) {
					return func() { k.Unlock("chain") }, k.Lock(ctx, "chain")
				},
				wait: func(ctx context.Context) error {
					if err := k.Lock(ctx, "chain"); err != nil {
						return err
					}
					k.Unlock("chain")
					return nil
				},
				waiting: func() bool {
					k.mu.Lock()
					defer k.mu.Unlock()
					return k.locks["chain"].refs == 2
				},
			}
		}, "waited_lock"},
		{"unpack place", func() shared {
			l := New(1)
			return shared{
				hold: l.Acquire,
				wait: func(ctx context.Context) error {
					_, w, applied := applyPaced(ctx, l)
					close(w.proceed)
					return <-applied
				},
				waiting: func() bool { return l.Waiting() == 1 },
			}
		}, "waited_unpack"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.new()
			holder, waiter := NewTicket(time.Now()), NewTicket(time.Now())
			release, err := c.hold(WithTicket(context.Background(), holder))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.wait(WithTicket(context.Background(), waiter)) }()
			await.Until(t, 10*time.Second, "the waiter to wait", c.waiting)
			release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := maps.Collect(waiter.Waits); got[tc.want] <= 0 || len(got) != 1 {
				t.Errorf("waiter's waits %v, want only %s", got, tc.want)
			}
			if got := maps.Collect(holder.Waits); len(got) != 0 {
				t.Errorf("holder's waits %v, want none", got)
			}
		})
	}
}
