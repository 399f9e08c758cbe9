package fleet_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/fleet"
	"github.com/pullwise/pullwise/integration/registry"
)

// TestFleetPeersOff is today's behaviour, which peers must leave
// byte-for-byte as it is when they are off: 2 and 4 Pullwise nodes pull
// one image through CRI, all at once and one after the other; every pull
// succeeds, names the registry as its source, took every blob from it,
// and the registry sent each blob once per node, whole.
func TestFleetPeersOff(t *testing.T) {
	f := fleet.New(t, fleet.Options{})
	nodes := make([]*fleet.Node, 4)
	for i := range nodes {
		nodes[i] = f.AddNode(t, daemon.Options{LogLevel: "info"})
	}
	seed := int64(4000)
	for _, n := range []int{2, 4} {
		for _, mode := range fleet.Modes {
			// A new image each time, so every node starts without it.
			seed++
			img := f.Push(t, "fleet/app", fmt.Sprintf("%d-%s", n, mode),
				registry.Image{Layers: []int64{3 << 20, 2 << 20, 1 << 20}, Seed: seed})
			t.Run(fmt.Sprintf("nodes=%d/%s", n, mode), func(t *testing.T) {
				took, err := fleet.Rollout(t.Context(), nodes[:n], img.Ref, mode)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("pull times by node: %v", took)
				// The link is the registry's limit: no pull beats its share.
				first, _, last := fleet.Spread(took)
				if least := f.LinkTime(int64(n) * img.Bytes); mode == fleet.Simultaneous && last < least {
					t.Errorf("%d nodes had their image after %s: %d Mbit/s send %d copies in no less than %s", n, last, f.RateMbit, n, least)
				}
				if least := f.LinkTime(img.Bytes); first < least {
					t.Errorf("a node had its image after %s: %d Mbit/s send it in no less than %s", first, f.RateMbit, least)
				}
				eg := f.TakeEgress(t)
				for _, node := range nodes[:n] {
					assertFromRegistry(t, node, img)
				}
				for _, d := range img.Blobs() {
					if got := eg.BlobGets[d]; got != n {
						t.Errorf("registry: %d GETs of blob %s, want one per node (%d)", got, d, n)
					}
				}
				if want := int64(n) * (img.ConfigSize + img.LayerBytes()); eg.BlobBytes != want {
					t.Errorf("registry sent %d bytes of blobs, want %d copies of the image's %d", eg.BlobBytes, n, want/int64(n))
				}
				if eg.Bytes < int64(n)*img.Bytes {
					t.Errorf("registry sent %d bytes, less than %d copies of the image's %d", eg.Bytes, n, img.Bytes)
				}
				t.Logf("registry sent %.3f copies of the image", float64(eg.Bytes)/float64(img.Bytes))
			})
		}
	}
}

// assertFromRegistry checks what `crictl inspecti` shows on node for img:
// the registry resolved it and served every blob, all its bytes.
func assertFromRegistry(t *testing.T, node *fleet.Node, img fleet.Image) {
	t.Helper()
	source, blobs := node.PullSource(t, img.Ref)
	if source != img.Ref {
		t.Errorf("node %s: pull source %q, want %q", node.Name, source, img.Ref)
	}
	var byHost map[string]struct {
		Blobs int   `json:"blobs"`
		Bytes int64 `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(blobs), &byHost); err != nil {
		t.Fatalf("node %s: blob sources %q: %v", node.Name, blobs, err)
	}
	reg := byHost[fleet.RegistryHost]
	if len(byHost) != 1 || reg.Blobs != len(img.Blobs()) || reg.Bytes != img.ConfigSize+img.LayerBytes() {
		t.Errorf("node %s: blob sources %s, want all %d blobs (%d bytes) from %s",
			node.Name, blobs, len(img.Blobs()), img.ConfigSize+img.LayerBytes(), fleet.RegistryHost)
	}
	for _, d := range img.Blobs() {
		if !node.Has(t, d) {
			t.Errorf("node %s: blob %s not in its content store", node.Name, d)
		}
	}
}

// TestFleetTeardown: while a fleet runs, its node reaches the registry on
// the bridge and nothing else (no default route, nothing in the host's
// namespace); once the test is over no namespace, link or process of it
// is left.
func TestFleetTeardown(t *testing.T) {
	var id string
	var pid int
	linksBefore := linkNames(t)
	t.Run("fleet", func(t *testing.T) {
		f := fleet.New(t, fleet.Options{RateMbit: 100, Latency: -1})
		node := f.AddNode(t, daemon.Options{LogLevel: "info"})
		id, pid = f.ID, node.Daemon.PID()
		names, err := fleet.Namespaces(id + "-")
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{id + "-hub", id + "-n0", id + "-reg"}; !slices.Equal(slices.Sorted(slices.Values(names)), want) {
			t.Errorf("namespaces %v, want %v", names, want)
		}
		if routes := output(t, "ip", "-n", node.NetNS, "route", "show", "table", "all"); strings.Contains(routes, "default") {
			t.Errorf("node %s has a default route:\n%s", node.Name, routes)
		}
		if addrs := output(t, "ip", "-o", "addr"); strings.Contains(addrs, "198.18.") {
			t.Errorf("the host's namespace has a fleet address:\n%s", addrs)
		}
		img := f.Push(t, "fleet/tiny", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 4100})
		if err := node.Pull(t.Context(), img.Ref); err != nil {
			t.Fatal(err)
		}
		if source, _ := node.PullSource(t, img.Ref); source != img.Ref {
			t.Errorf("pull source %q, want %q", source, img.Ref)
		}
	})
	if id == "" {
		t.Fatal("the fleet did not start")
	}
	if names, err := fleet.Namespaces(id + "-"); err != nil || len(names) > 0 {
		t.Errorf("left after cleanup: namespaces %v (%v)", names, err)
	}
	ours := fmt.Sprintf("%s%d-", fleet.Prefix, os.Getpid())
	if all, err := fleet.Namespaces(ours); err != nil || len(all) > 0 {
		t.Errorf("namespaces of this run (%s…) after cleanup: %v (%v)", ours, all, err)
	}
	if err := syscall.Kill(pid, 0); err != syscall.ESRCH {
		t.Errorf("node's containerd (pid %d) still there after cleanup: %v", pid, err)
	}
	if after := linkNames(t); !slices.Equal(after, linksBefore) {
		t.Errorf("the host's links were %v before the fleet and are %v after", linksBefore, after)
	}
}

func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// linkNames lists the links of the host's namespace, sorted.
func linkNames(t *testing.T) []string {
	t.Helper()
	var names []string
	for line := range strings.Lines(output(t, "ip", "-o", "link", "show")) {
		// "3: name@peer: <FLAGS> …"
		if f := strings.Fields(line); len(f) > 1 {
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, name)
		}
	}
	return slices.Sorted(slices.Values(names))
}
