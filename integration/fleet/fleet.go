// Package fleet runs N real Pullwise (or stock) containerd daemons on one
// machine, each in its own network namespace, and a CNCF Distribution
// registry in another, all on one bridge, for tests and benchmarks of
// what a rollout to many nodes costs the registry.
//
// Layout, all in namespaces named Prefix+"<pid>-<seq>-…", made by the
// test and removed in its cleanup:
//
//	hub   the bridge br0 and the host ends of the veths ("reg", "n0", …)
//	reg   the registry at RegistryIP:5000; its eth0 shaped by tc (TBF)
//	n<i>  node i at 198.18.0.(10+i); containerd runs there (nsenter --net)
//
// Addresses are from the benchmarking range 198.18.0.0/15, in a /24 that
// only the fleet's namespaces know; no namespace has a default route,
// and the host's namespace gets no link, address or route, so nothing
// the fleet sends can leave the machine. Latency is added per request
// in the registry's handler (registry.WAN), since this kernel has no
// netem; the rate limit is the kernel's, on the registry's link.
//
// The test process talks to each node through its socket, which lives
// on the shared filesystem, and seeds the registry through its loopback
// address in the host's namespace, which no node can reach.
package fleet

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/registry"
)

// RegistryIP is the registry's address; nodes reach it at RegistryHost.
const (
	RegistryIP   = "198.18.0.1"
	RegistryHost = RegistryIP + ":5000"
	subnet       = "/24"
)

// Options shape a fleet's registry link.
type Options struct {
	// RateMbit is the registry link's rate in Mbit/s, shared by all the
	// registry sends; 400 when zero.
	RateMbit int
	// Latency is added before the registry serves each request; 20 ms
	// (registry.DefaultWAN's) when zero, none when negative.
	Latency time.Duration
}

// Fleet is a registry in its own namespace and the nodes added to it.
type Fleet struct {
	ID       string // the namespaces' common prefix
	Registry *registry.Registry
	HostsDir string // hosts.toml tree every node reads
	RateMbit int    // the registry link's rate
	tb       testing.TB
	hub      string
	nodes    int
	// clusterKey is the peers' key file, made by the first PeersConfig.
	clusterKey string
}

// New makes the bridge and the registry's namespace, starts the
// registry and serves it at RegistryHost behind opts' link. Everything
// is removed when the test ends.
func New(t testing.TB, opts Options) *Fleet {
	t.Helper()
	for _, tool := range []string{"ip", "tc", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("fleet needs %s (iproute2, util-linux): %v", tool, err)
		}
	}
	if err := sweepLeftovers(); err != nil {
		t.Fatalf("remove namespaces left by earlier runs: %v", err)
	}
	f := &Fleet{ID: newID(), HostsDir: t.TempDir(), tb: t}
	f.hub = f.ID + "-hub"
	if err := f.addNamespace(f.hub); err != nil {
		t.Fatal(err)
	}
	if err := ip("ip", "-n", f.hub, "link", "add", "br0", "type", "bridge"); err != nil {
		t.Fatal(err)
	}
	if err := ip("ip", "-n", f.hub, "link", "set", "br0", "up"); err != nil {
		t.Fatal(err)
	}
	reg := f.ID + "-reg"
	if err := f.addNamespace(reg); err != nil {
		t.Fatal(err)
	}
	if err := link(f.hub, "reg", reg, RegistryIP+subnet); err != nil {
		t.Fatal(err)
	}
	f.RateMbit = opts.rate()
	if err := shape(reg, f.RateMbit); err != nil {
		t.Fatal(err)
	}
	f.Registry = registry.Start(t, registry.Options{Name: "fleet"})
	f.serve(t, reg, opts.latency())
	if err := registry.WriteHosts(f.HostsDir, RegistryHost, "http://"+RegistryHost, ""); err != nil {
		t.Fatal(err)
	}
	return f
}

func (o Options) rate() int {
	if o.RateMbit > 0 {
		return o.RateMbit
	}
	return 400
}

func (o Options) latency() time.Duration {
	switch {
	case o.Latency < 0:
		return 0
	case o.Latency == 0:
		return registry.DefaultWAN.Latency
	}
	return o.Latency
}

// addNamespace makes ns and removes it when the test ends, after
// everything registered later (daemons, the registry) has stopped.
func (f *Fleet) addNamespace(ns string) error {
	if err := ip("ip", "netns", "add", ns); err != nil {
		return err
	}
	f.tb.Cleanup(func() {
		if err := removeNamespace(ns); err != nil {
			f.tb.Error(err)
		}
	})
	return nil
}

// shape limits what namespace ns sends on its eth0 to mbit Mbit/s with
// a token bucket: a burst of 10 ms at that rate (no less than 64 KiB)
// and up to 50 ms of queue, so TCP sees a link of that rate, not drops.
func shape(ns string, mbit int) error {
	burst := Burst(mbit)
	return ip("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", "tbf",
		"rate", fmt.Sprintf("%dmbit", mbit), "burst", fmt.Sprint(burst), "latency", "50ms")
}

// Burst is how many bytes the registry's link sends above its rate at
// most, for tests that bound a transfer's time from below.
func Burst(mbit int) int { return max(mbit*1000*1000/8/100, 64<<10) }

// LinkTime is the least time the registry's link takes to send n bytes.
func (f *Fleet) LinkTime(n int64) time.Duration {
	bytesPerSecond := float64(f.RateMbit) * 1e6 / 8
	return time.Duration(float64(max(n-int64(Burst(f.RateMbit)), 0)) / bytesPerSecond * float64(time.Second))
}
