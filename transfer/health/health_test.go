package health

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

var (
	mirror   = Key{Scheme: "http", Host: "127.0.0.1:5001", Path: "/v2"}
	upstream = Key{Scheme: "http", Host: "127.0.0.1:5000", Path: "/v2"}
)

// clock is a settable time for the table, safe to read while requests
// wait in other goroutines.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newTable(cfg Config) (*Table, *clock) {
	c := &clock{t: time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)}
	t := New(cfg)
	t.now = c.now
	return t, c
}

var ctx = context.Background()

func send(t *testing.T, tb *Table, k Key, mustTry bool, o Outcome) (sent bool) {
	t.Helper()
	r, err := tb.Admit(k, mustTry)
	if err != nil {
		var skip *SkippedError
		if !errors.As(err, &skip) {
			t.Fatalf("Admit: %v", err)
		}
		return false
	}
	r.Report(ctx, o, string(o))
	return true
}

func status(t *testing.T, tb *Table, k Key) Status {
	t.Helper()
	for _, s := range tb.Hosts() {
		if s.Key == k {
			return s
		}
	}
	t.Fatalf("%s unknown to the table", k)
	return Status{}
}

func TestOutcomes(t *testing.T) {
	cfg := Config{Cooldown: 10 * time.Second, MaxCooldown: time.Minute, ThrottleLimit: 3}
	for _, tc := range []struct {
		name     string
		outcomes []Outcome
		down     bool
	}{
		{"ok", []Outcome{OK}, false},
		{"404 is an answer", []Outcome{Answer, Answer, Answer}, false},
		{"5xx", []Outcome{ServerError}, true},
		{"refused", []Outcome{Unreachable}, true},
		{"stalled", []Outcome{Timeout}, true},
		{"429 within the retry budget", []Outcome{Throttled, Throttled}, false},
		{"429 beyond the retry budget", []Outcome{Throttled, Throttled, Throttled}, true},
		{"success resets the 429 streak", []Outcome{Throttled, Throttled, OK, Throttled, Throttled}, false},
		{"canceled says nothing", []Outcome{Canceled, Canceled}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb, _ := newTable(cfg)
			for _, o := range tc.outcomes {
				if !send(t, tb, mirror, false, o) {
					t.Fatalf("request skipped before %v", o)
				}
			}
			if got := !status(t, tb, mirror).Up; got != tc.down {
				t.Fatalf("down = %v, want %v", got, tc.down)
			}
			if tc.down != !tb.Usable(mirror) {
				t.Fatalf("Usable = %v while down = %v", tb.Usable(mirror), tc.down)
			}
		})
	}
}

func TestCooldownProbeAndRecovery(t *testing.T) {
	tb, clk := newTable(Config{Cooldown: 10 * time.Second, MaxCooldown: 35 * time.Second})
	send(t, tb, mirror, false, ServerError)
	failedAt := clk.t

	// Skipped during the cooldown, with the reason.
	clk.advance(9 * time.Second)
	_, err := tb.Admit(mirror, false)
	if err == nil || !strings.Contains(err.Error(), "server_error") {
		t.Fatalf("Admit during cooldown = %v, want a skip naming the last error", err)
	}

	// Cooldowns double on each failed probe, up to the maximum.
	for i, cd := range []time.Duration{10 * time.Second, 20 * time.Second, 35 * time.Second, 35 * time.Second} {
		s := status(t, tb, mirror)
		if got := s.NextProbe.Sub(failedAt); got != cd {
			t.Fatalf("failure %d: cooldown %v, want %v", i+1, got, cd)
		}
		clk.t = s.NextProbe
		probe, err := tb.Admit(mirror, false)
		if err != nil {
			t.Fatalf("probe after cooldown %d: %v", i+1, err)
		}
		// Only one probe at a time.
		if _, err := tb.Admit(mirror, false); err == nil {
			t.Fatal("second request admitted while a probe is in flight")
		}
		if i == 3 {
			probe.Report(ctx, OK, "")
			break
		}
		probe.Report(ctx, ServerError, "503")
		failedAt = clk.t
	}
	if s := status(t, tb, mirror); !s.Up || s.Failures != 0 {
		t.Fatalf("after a successful probe: %+v, want up", s)
	}
	if !send(t, tb, mirror, false, OK) {
		t.Fatal("healthy host skipped")
	}
}

func TestMustTryWhenEveryHostIsDown(t *testing.T) {
	tb, _ := newTable(Config{Cooldown: time.Minute})
	send(t, tb, upstream, false, Unreachable)
	// The last host of a request is tried anyway, and an answer revives it.
	if !send(t, tb, upstream, true, Answer) {
		t.Fatal("last resort request skipped")
	}
	if !status(t, tb, upstream).Up {
		t.Fatal("a host that answered stays down")
	}
}

func TestRequestsFromBeforeTheFailure(t *testing.T) {
	tb, clk := newTable(Config{Cooldown: 10 * time.Second, MaxCooldown: time.Minute})
	early := make([]*Request, 3)
	for i := range early {
		early[i], _ = tb.Admit(mirror, false)
	}
	early[0].Report(ctx, ServerError, "503")
	// Concurrent failures of requests sent before the host was marked count
	// once; a late success of one of them does not revive it.
	early[1].Report(ctx, ServerError, "503")
	early[2].Report(ctx, OK, "")
	s := status(t, tb, mirror)
	if s.Up || s.NextProbe != clk.t.Add(10*time.Second) {
		t.Fatalf("status %+v: want down for one base cooldown", s)
	}
}

func TestCanceledProbeFreesTheProbe(t *testing.T) {
	tb, clk := newTable(Config{Cooldown: time.Second})
	send(t, tb, mirror, false, Timeout)
	clk.advance(time.Second)
	probe, err := tb.Admit(mirror, false)
	if err != nil {
		t.Fatal(err)
	}
	probe.Report(ctx, Canceled, "")
	if _, err := tb.Admit(mirror, false); err != nil {
		t.Fatalf("probe still held after its request was canceled: %v", err)
	}
}

func TestZeroCooldownRemembersNothing(t *testing.T) {
	tb, _ := newTable(Config{})
	for range 3 {
		if !send(t, tb, mirror, false, ServerError) {
			t.Fatal("request skipped with the memory off")
		}
	}
	if s := status(t, tb, mirror); !s.Up || s.LastError != "server_error" || s.Requests[ServerError] != 3 {
		t.Fatalf("status %+v", s)
	}
	var nilTable *Table
	if _, err := nilTable.Admit(mirror, false); err != nil || !nilTable.Usable(mirror) {
		t.Fatal("a nil table skips")
	}
}

func TestMetrics(t *testing.T) {
	tb, _ := newTable(Config{Cooldown: time.Minute})
	send(t, tb, mirror, false, ServerError)
	send(t, tb, mirror, false, OK) // skipped
	send(t, tb, upstream, false, OK)
	want := `
# HELP pullwise_registry_host_up 1 while a registry host is used, 0 while it is skipped after failing.
# TYPE pullwise_registry_host_up gauge
pullwise_registry_host_up{host="http://127.0.0.1:5000/v2"} 1
pullwise_registry_host_up{host="http://127.0.0.1:5001/v2"} 0
# HELP pullwise_registry_requests_total Requests to registry hosts by outcome, skipped ones included.
# TYPE pullwise_registry_requests_total counter
pullwise_registry_requests_total{host="http://127.0.0.1:5000/v2",outcome="ok"} 1
pullwise_registry_requests_total{host="http://127.0.0.1:5001/v2",outcome="server_error"} 1
pullwise_registry_requests_total{host="http://127.0.0.1:5001/v2",outcome="skipped"} 1
`
	if err := testutil.CollectAndCompare(tb, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentFlapping drives one table from many goroutines while a
// host flaps; -race checks the locking, and the probe is never held twice.
func TestConcurrentFlapping(t *testing.T) {
	tb := New(Config{Cooldown: time.Millisecond, MaxCooldown: 4 * time.Millisecond})
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		probing int
		maxSeen int
	)
	for g := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				r, err := tb.Admit(mirror, i%7 == 0)
				if err != nil {
					continue
				}
				if r.probe {
					mu.Lock()
					probing++
					maxSeen = max(maxSeen, probing)
					mu.Unlock()
				}
				o := OK
				if (g+i)%3 == 0 {
					o = ServerError
				}
				wasProbe := r.probe
				if wasProbe {
					mu.Lock()
					probing--
					mu.Unlock()
				}
				r.Report(ctx, o, "flap")
				_ = tb.Hosts()
			}
		}()
	}
	wg.Wait()
	if maxSeen > 1 {
		t.Fatalf("%d probes in flight at once", maxSeen)
	}
	s := status(t, tb, mirror)
	var total uint64
	for _, n := range s.Requests {
		total += n
	}
	if total != 50*200 {
		t.Fatalf("counted %d requests, want %d", total, 50*200)
	}
}
