package fleet_test

import (
	"fmt"
	"io"
	"os"
	"testing"

	"k8s.io/klog/v2"

	"github.com/pullwise/pullwise/integration/daemon"
)

// TestMain runs the fleet's tests and benchmarks only where the binaries
// are named (PULLWISE_BIN, as `make integration` and `make bench-fleet`
// set it): `make unit` lists every package and runs this one without
// them. Named, it needs root, as the other integration tests do, and
// fails rather than skips without it.
func TestMain(m *testing.M) {
	if os.Getenv("PULLWISE_BIN") == "" {
		fmt.Println("fleet: not run: set PULLWISE_BIN to the built binaries, as root (make integration, make bench-fleet)")
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "fleet tests need root (network namespaces, mounts, a real containerd): run them with sudo")
		os.Exit(1)
	}
	if _, err := os.Stat(daemon.Bin("containerd")); err != nil {
		fmt.Fprintf(os.Stderr, "missing containerd: run 'make containerd' first: %v\n", err)
		os.Exit(1)
	}
	// Kubelet's CRI client logs every failed call through klog; the
	// tests check those errors themselves.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}
