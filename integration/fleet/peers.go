package fleet

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/transfer/peers"
)

// PeersConfig is the config that turns peers on for a node of f: every
// node holds the fleet's cluster key and joins through the first node,
// n0, by its address ("dns:" with an IP needs no name service).
func (f *Fleet) PeersConfig(t testing.TB) string {
	t.Helper()
	if f.clusterKey == "" {
		f.clusterKey = filepath.Join(t.TempDir(), "cluster.key")
		if err := peers.GenerateClusterKey(f.clusterKey); err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf(`
[plugins."io.containerd.grpc.v1.pullwise".peers]
  enabled = true
  cluster_key_file = %q
  bootstrap = ["dns:%s:5001"]
`, f.clusterKey, nodeIP(0))
}

// nodeIP is node i's address on the bridge.
func nodeIP(i int) string { return fmt.Sprintf("198.18.0.%d", 10+i) }

// Metric is the value of a prometheus sample of node n, named as the
// exposition writes it (`name` or `name{label="v"}`), read from inside
// the node's namespace, where its metrics address is; 0 when absent.
func (n *Node) Metric(t testing.TB, sample string) float64 {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return dialIn(ctx, n.NetNS, addr) },
	}}
	defer c.CloseIdleConnections()
	v, _ := daemon.Scrape(t, c, n.Daemon.MetricsAddr, sample)
	return v
}

// AwaitMesh waits until every node with peers on is connected to all the
// others, as the nodes of a cluster are long before a rollout.
func AwaitMesh(t testing.TB, nodes []*Node) {
	t.Helper()
	await.Until(t, 30*time.Second, "every node to join its peers", func() bool {
		for _, n := range nodes {
			if n.Metric(t, "pullwise_peers_connected") < float64(len(nodes)-1) {
				return false
			}
		}
		return true
	})
}

// PullAndAnnounce pulls img through CRI with auth (nil: none) and waits
// until the node has announced its blobs to its peers: a rolling update
// waits for a node's pod before the next node pulls, far longer than
// announcing a few blobs takes; a test waits for it explicitly.
func (n *Node) PullAndAnnounce(t testing.TB, img Image, auth *criapi.AuthConfig) {
	t.Helper()
	before := n.Metric(t, "pullwise_peer_announcements_total")
	if err := n.PullWith(t.Context(), img.Ref, auth); err != nil {
		t.Fatal(err)
	}
	await.Until(t, 30*time.Second, "node "+n.Name+" to announce the image's blobs", func() bool {
		return n.Metric(t, "pullwise_peer_announcements_total")-before >= float64(len(img.Blobs()))
	})
}

// Registries is what `pullctl registries` shows on node n: the hosts its
// pulls used, its peers among them.
func (n *Node) Registries(t testing.TB) []*api.RegistryHost {
	t.Helper()
	resp, err := api.NewPullwiseClient(n.conn).ListRegistries(t.Context(), &api.ListRegistriesRequest{})
	if err != nil {
		t.Fatalf("node %s: list registries: %v", n.Name, err)
	}
	return resp.GetHosts()
}
