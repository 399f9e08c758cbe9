package lane

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"
)

// Pressure tells whether tasks on the node wait for a CPU, from the
// kernel's pressure stall information: the time during which at least one
// runnable task had no CPU ("some" in /proc/pressure/cpu), a counter in
// microseconds. Idle time in /proc/stat would not do: it is counted in
// 10 ms ticks, too coarse for the tenth of a second looked at here, and a
// CPU can be busy with nobody waiting for it.
type Pressure struct {
	read func() (stalled time.Duration, err error)
	now  func() time.Time

	mu        sync.Mutex
	at        time.Time     // when stalled was read
	stalled   time.Duration // the counter then
	contended bool          // the answer for the window before at
	failed    bool          // the read at at failed: stalled is older
}

// pressureWindow is how long Pressure looks back: long enough to average
// out a scheduler's tick, short enough to follow a pod start, which takes
// a few tenths of a second; work that asks more often gets the last
// answer.
const pressureWindow = 100 * time.Millisecond

// contendedShare is the share of a window in which some task waited for a
// CPU that makes the CPUs contended. Below it the waits are the scheduler's
// own jitter, and a pause would mostly leave a CPU to nobody.
const contendedShare = 0.2

// NewPressure reads path (/proc/pressure/cpu). It returns nil, and an
// error saying why, where the kernel keeps no pressure stall information
// (CONFIG_PSI off, or psi=0 on its command line).
func NewPressure(path string) (*Pressure, error) {
	read := func() (time.Duration, error) { return readStalled(path) }
	stalled, err := read()
	if err != nil {
		return nil, err
	}
	return &Pressure{read: read, now: time.Now, at: time.Now(), stalled: stalled}, nil
}

// Contended reports whether some task waited for a CPU for at least
// contendedShare of the last window.
func (p *Pressure) Contended() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	elapsed := now.Sub(p.at)
	if elapsed < pressureWindow {
		return p.contended
	}
	stalled, err := p.read()
	p.at = now
	if err != nil {
		// The file was there at start: a read that fails now says
		// nothing, so nothing gives way until one succeeds again.
		p.contended, p.failed = false, true
		return false
	}
	p.contended = !p.failed && float64(stalled-p.stalled) >= contendedShare*float64(elapsed)
	p.stalled, p.failed = stalled, false
	return p.contended
}

// readStalled reads the "some" line's total of a pressure file.
func readStalled(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read CPU pressure: %w", err)
	}
	for line := range bytes.Lines(b) {
		fields := bytes.Fields(line)
		if len(fields) == 0 || string(fields[0]) != "some" {
			continue
		}
		for _, f := range fields[1:] {
			if v, ok := bytes.CutPrefix(f, []byte("total=")); ok {
				us, err := strconv.ParseUint(string(v), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("parse %s: %w", path, err)
				}
				return time.Duration(us) * time.Microsecond, nil
			}
		}
	}
	return 0, fmt.Errorf("parse %s: no \"some\" total", path)
}
