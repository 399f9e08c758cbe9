package kubelet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/pullwise/pullwise/integration/daemon"
)

func TestMain(m *testing.M) {
	// Fail rather than skip: a run that cannot start kubelet must not pass
	// as green. `make test` only starts this package as root.
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "kubelet end-to-end tests need root (kubelet, mounts, a real containerd): run them with sudo")
		os.Exit(1)
	}
	// daemon.Bin defaults to ../bin, right for ./integration; this package
	// is one level deeper.
	if os.Getenv("PULLWISE_BIN") == "" {
		if abs, err := filepath.Abs("../../bin"); err == nil {
			os.Setenv("PULLWISE_BIN", abs)
		}
	}
	if _, err := exec.LookPath("runc"); err != nil {
		fmt.Fprintln(os.Stderr, "runc not found: pods need it (apt-get install runc; .ci/run installs it)")
		os.Exit(1)
	}
	for _, b := range []string{"containerd", "ctr", "pullctl", "containerd-shim-runc-v2"} {
		if _, err := os.Stat(daemon.Bin(b)); err != nil {
			fmt.Fprintf(os.Stderr, "missing %s: run 'make build' first (or set PULLWISE_BIN): %v\n", b, err)
			os.Exit(1)
		}
	}
	if err := CheckBinary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
