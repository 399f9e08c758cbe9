package await

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records its message and ends
// the goroutine, as the real one does, without failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// until runs Until with a recorder and returns the message it failed with,
// "" if it returned.
func until(t *testing.T, timeout time.Duration, what string, cond func() bool) string {
	t.Helper()
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(r, timeout, what, cond)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("Until(%s, %q) still waiting after 10s", timeout, what)
	}
	return r.msg
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var checks atomic.Int32
	if msg := until(t, 10*time.Second, "the third check", func() bool { return checks.Add(1) == 3 }); msg != "" {
		t.Fatalf("failed: %s", msg)
	}
	if n := checks.Load(); n != 3 {
		t.Fatalf("%d checks, want 3: it stops polling once the condition holds", n)
	}
}

func TestUntilFailsNamingWhatAtTheDeadline(t *testing.T) {
	start := time.Now()
	msg := until(t, 50*time.Millisecond, "nothing", func() bool { return false })
	if want := "timed out after 50ms waiting for nothing"; msg != want {
		t.Fatalf("message %q, want %q", msg, want)
	}
	if took := time.Since(start); took < 50*time.Millisecond {
		t.Fatalf("failed after %s, before its deadline", took)
	}
}

func TestWithinChecksAgainAtTheDeadline(t *testing.T) {
	deadline := time.Now().Add(30 * time.Millisecond)
	// Holds only from the deadline on: the last check, at the deadline,
	// sees it.
	if !Within(30*time.Millisecond, func() bool { return !time.Now().Before(deadline) }) {
		t.Fatal("a condition holding at the deadline was not seen")
	}
}
