// Integration tests run the real bin/containerd (built by `make build`)
// against CNCF Distribution registries on loopback, and talk to it with
// kubelet's CRI client, ctr and pullctl.
package integration

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"

	"k8s.io/klog/v2"

	"github.com/pullwise/pullwise/integration/daemon"
)

func TestMain(m *testing.M) {
	// Failing here, rather than skipping, keeps a run without root from
	// passing as green; `make test` only starts this package as root.
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "integration tests need root (mounts and a real containerd): run them with sudo")
		os.Exit(1)
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
	// Kubelet's CRI client logs every failed call through klog. The tests
	// check those errors themselves, and the soak makes thousands on purpose.
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}
