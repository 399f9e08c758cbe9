package daemon

import (
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// Stall is how long, so far, some task on the node waited for a CPU and
// for the disk (Linux's pressure stall information, the "some" lines of
// /proc/pressure/cpu and /proc/pressure/io). Node-wide, not containerd's
// own: a burst's pods wait on what the kubelet, the shims and the
// page-cache writeback do too, and on either runtime alike.
type Stall struct {
	CPU, IO time.Duration
}

// Sub is what s adds to an earlier reading.
func (s Stall) Sub(earlier Stall) Stall {
	return Stall{CPU: s.CPU - earlier.CPU, IO: s.IO - earlier.IO}
}

// NodeStall reads the node's Stall; a kernel without pressure stall
// information (CONFIG_PSI, psi=0) fails the benchmark, as a figure of
// zero would read as no stall.
func NodeStall(t testing.TB) Stall {
	t.Helper()
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatalf("procfs: %v", err)
	}
	var s Stall
	for _, r := range []struct {
		resource string
		into     *time.Duration
	}{{"cpu", &s.CPU}, {"io", &s.IO}} {
		psi, err := fs.PSIStatsForResource(r.resource)
		if err != nil {
			t.Fatalf("pressure stall of %s: %v", r.resource, err)
		}
		if psi.Some == nil {
			t.Fatalf("pressure stall of %s: no \"some\" line", r.resource)
		}
		*r.into = time.Duration(psi.Some.Total) * time.Microsecond
	}
	return s
}
