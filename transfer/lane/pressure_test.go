package lane

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// fakePressure is a Pressure over a stall counter and a clock that move
// only when told.
type fakePressure struct {
	stalled time.Duration
	err     error
	reads   int
	clock   fakeClock
}

func (f *fakePressure) pressure() *Pressure {
	return &Pressure{
		read: func() (time.Duration, error) { f.reads++; return f.stalled, f.err },
		now:  f.clock.now,
		at:   f.clock.t,
	}
}

// TestPressure: the CPUs are contended when some task waited for one for
// a fifth of the window or more, the counter is read at most once a
// window, and a read that fails contends nothing.
func TestPressure(t *testing.T) {
	cases := []struct {
		name    string
		after   time.Duration // since the last read
		stalled time.Duration // of it, some task waited
		err     error
		want    bool
	}{
		{name: "idle", after: pressureWindow, want: false},
		{name: "a fifth of the window waited", after: pressureWindow, stalled: pressureWindow / 5, want: true},
		{name: "all of it", after: 3 * pressureWindow, stalled: 3 * pressureWindow, want: true},
		{name: "a tenth is jitter", after: pressureWindow, stalled: pressureWindow / 10, want: false},
		{name: "a share of a long window", after: 10 * pressureWindow, stalled: pressureWindow, want: false},
		{name: "a read that fails", after: pressureWindow, stalled: pressureWindow, err: errors.New("gone"), want: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakePressure{clock: fakeClock{t: time.Now()}, stalled: time.Hour}
			p := f.pressure()
			p.stalled = f.stalled
			f.clock.t = f.clock.t.Add(tc.after)
			f.stalled += tc.stalled
			f.err = tc.err
			if got := p.Contended(); got != tc.want {
				t.Fatalf("Contended() = %v, want %v", got, tc.want)
			}
			// Asked again within the window: the same answer, unread.
			reads := f.reads
			f.clock.t = f.clock.t.Add(pressureWindow / 2)
			f.stalled += pressureWindow / 2
			if got := p.Contended(); got != tc.want || f.reads != reads {
				t.Fatalf("within the window: Contended() = %v after %d reads, want %v after %d", got, f.reads, tc.want, reads)
			}
		})
	}
}

func TestReadStalled(t *testing.T) {
	cases := []struct {
		name, file string
		want       time.Duration
		err        bool
	}{
		{name: "cgroup v2 kernel", file: "some avg10=0.52 avg60=11.89 avg300=12.35 total=5439367628\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", want: 5439367628 * time.Microsecond},
		{name: "without a full line", file: "some avg10=0.00 avg60=0.00 avg300=0.00 total=12\n", want: 12 * time.Microsecond},
		{name: "no some line", file: "full avg10=0.00 avg60=0.00 avg300=0.00 total=12\n", err: true},
		{name: "a total that is no number", file: "some avg10=0.00 total=many\n", err: true},
		{name: "empty", file: "", err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cpu")
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := readStalled(path)
			if (err != nil) != tc.err || got != tc.want {
				t.Fatalf("readStalled = %v, %v; want %v, error %v", got, err, tc.want, tc.err)
			}
		})
	}
	if p, err := NewPressure(filepath.Join(t.TempDir(), "none")); p != nil || err == nil {
		t.Fatalf("NewPressure of a missing file = %v, %v; want nil and an error", p, err)
	}
}
