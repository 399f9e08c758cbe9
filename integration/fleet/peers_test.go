package fleet_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/fleet"
	"github.com/pullwise/pullwise/integration/registry"
	"github.com/pullwise/pullwise/internal/await"
)

// TestFleetPeers: 4 Pullwise nodes with peers on pull one image through
// CRI, one after the other. The first takes it from the registry and
// the others take every blob from their peers: the registry sends each
// blob once, every node names the registry as the image's source (the
// manifest is always the registry's) and its peers as where its blobs
// came from, and the blobs are in every node's content store.
func TestFleetPeers(t *testing.T) {
	f := fleet.New(t, fleet.Options{})
	cfg := f.PeersConfig(t)
	nodes := make([]*fleet.Node, 4)
	for i := range nodes {
		nodes[i] = f.AddNode(t, daemon.Options{LogLevel: "info", ExtraConfig: cfg})
	}
	await.Until(t, 30*time.Second, "every node to join its peers", func() bool {
		for _, n := range nodes {
			if n.Metric(t, "pullwise_peers_connected") < float64(len(nodes)-1) {
				return false
			}
		}
		return true
	})

	img := f.Push(t, "fleet/app", "peers", registry.Image{Layers: []int64{3 << 20, 2 << 20, 1 << 20}, Seed: 4300})
	if err := nodes[0].Pull(t.Context(), img.Ref); err != nil {
		t.Fatal(err)
	}
	// A rolling update waits for a node's pod before the next node's, far
	// longer than announcing a few blobs takes; here the wait is explicit.
	await.Until(t, 30*time.Second, "the first node to announce its blobs", func() bool {
		return nodes[0].Metric(t, "pullwise_peer_announcements_total") >= float64(len(img.Blobs()))
	})
	for _, n := range nodes[1:] {
		if err := n.Pull(t.Context(), img.Ref); err != nil {
			t.Fatal(err)
		}
	}
	eg := f.TakeEgress(t)
	for _, d := range img.Blobs() {
		if got := eg.BlobGets[d]; got != 1 {
			t.Errorf("registry: %d GETs of blob %s, want 1 for the fleet", got, d)
		}
	}
	t.Logf("registry sent %.3f copies of the image to %d nodes", float64(eg.Bytes)/float64(img.Bytes), len(nodes))
	assertFromRegistry(t, nodes[0], img)
	var fetched float64
	for _, n := range nodes[1:] {
		assertFromPeers(t, n, img)
		fetched += n.Metric(t, "pullwise_peer_bytes_fetched_total")
	}
	if want := float64(len(nodes)-1) * float64(img.ConfigSize+img.LayerBytes()); fetched != want {
		t.Errorf("nodes fetched %.0f bytes from peers, want %.0f: every blob of the image for each", fetched, want)
	}
}

// assertFromPeers checks what `crictl inspecti` shows on node for img:
// the registry resolved it, and peers served every blob, all its bytes.
func assertFromPeers(t *testing.T, node *fleet.Node, img fleet.Image) {
	t.Helper()
	source, blobs := node.PullSource(t, img.Ref)
	if source != img.Ref {
		t.Errorf("node %s: pull source %q, want %q: the registry resolves the image", node.Name, source, img.Ref)
	}
	var byHost map[string]struct {
		Blobs int   `json:"blobs"`
		Bytes int64 `json:"bytes"`
	}
	if err := json.Unmarshal([]byte(blobs), &byHost); err != nil {
		t.Fatalf("node %s: blob sources %q: %v", node.Name, blobs, err)
	}
	var n int
	var bytes int64
	for host, s := range byHost {
		if !strings.HasPrefix(host, "peer/") {
			t.Errorf("node %s: %d blobs from %s, want every blob from a peer", node.Name, s.Blobs, host)
			continue
		}
		n, bytes = n+s.Blobs, bytes+s.Bytes
	}
	if n != len(img.Blobs()) || bytes != img.ConfigSize+img.LayerBytes() {
		t.Errorf("node %s: %d blobs (%d bytes) from peers, want %d (%d): %s", node.Name, n, bytes, len(img.Blobs()), img.ConfigSize+img.LayerBytes(), blobs)
	}
	for _, d := range img.Blobs() {
		if !node.Has(t, d) {
			t.Errorf("node %s: blob %s not in its content store", node.Name, d)
		}
	}
}
