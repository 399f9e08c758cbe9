package fleet_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/fleet"
	"github.com/pullwise/pullwise/integration/registry"
)

// arm is one kind of node a rollout runs on: the last element of each
// sub-benchmark's name.
type arm struct {
	name   string
	binary string // in bin/
	// peers turns the node's peers on.
	peers bool
}

var arms = []arm{
	{name: "peers", binary: "containerd", peers: true},
	{name: "pullwise", binary: "containerd"},
	{name: "stock", binary: "containerd-stock"},
}

var fleetSizes = []int{1, 2, 4, 8}

// benchImage is 40 MiB in four layers of random bytes: the link, not
// gunzip, is what a rollout waits on.
var benchImage = registry.Image{Layers: []int64{20 << 20, 12 << 20, 6 << 20, 2 << 20}, Seed: 4200}

// BenchmarkFleet: N nodes (1, 2, 4, 8) in their own network namespaces
// pull one image through CRI from a registry behind a 400 Mbit/s link
// with 20 ms per request, all at once (simultaneous) and each once the
// one before it has its image (staggered), on Pullwise and on stock
// containerd. Every iteration starts from nodes without the image. It
// reports, per rollout:
//   - registry-copies: the registry's response bytes over one copy of
//     the image (manifest, config, layers);
//   - blob-gets/digest: the most GETs any one blob had;
//   - first-node-s, median-node-s, last-node-s: node pull times, each
//     from the node's own request to its answer;
//   - peer-share, max-upload-MiB: the share of the nodes' blob bytes
//     that came from peers, and the most one node uploaded to them; 0
//     without peers.
func BenchmarkFleet(b *testing.B) {
	for _, a := range arms {
		if _, err := os.Stat(daemon.Bin(a.binary)); err != nil {
			b.Fatalf("%s missing (make bench-fleet builds it): %v", a.binary, err)
		}
	}
	f := fleet.New(b, fleet.Options{RateMbit: 400})
	img := f.Push(b, "fleet/bench", "v1", benchImage)
	// Each arm's nodes start once and serve every fleet size: the first n.
	nodes := map[string][]*fleet.Node{}
	for _, a := range arms {
		opts := daemon.Options{Binary: daemon.Bin(a.binary), LogLevel: "info"}
		if a.peers {
			opts.ExtraConfig = f.PeersConfig(b)
		}
		for range slices.Max(fleetSizes) {
			nodes[a.name] = append(nodes[a.name], f.AddNode(b, opts))
		}
		if a.peers {
			fleet.AwaitMesh(b, nodes[a.name])
		}
	}
	for _, n := range fleetSizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for _, mode := range fleet.Modes {
				b.Run(string(mode), func(b *testing.B) {
					for _, a := range arms {
						b.Run(a.name, func(b *testing.B) { benchRollout(b, f, nodes[a.name][:n], img, mode) })
					}
				})
			}
		})
	}
}

func benchRollout(b *testing.B, f *fleet.Fleet, nodes []*fleet.Node, img fleet.Image, mode fleet.Mode) {
	var copies, first, median, last, fromPeers, upload float64
	gets := 0
	for range b.N {
		b.StopTimer()
		for _, n := range nodes {
			n.Clean(b, img)
		}
		f.TakeEgress(b)
		fetched, served := peerBytes(b, nodes)
		b.StartTimer()
		took, err := fleet.Rollout(context.Background(), nodes, img.Ref, mode)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		fetchedAfter, servedAfter := peerBytes(b, nodes)
		for i := range nodes {
			fromPeers += fetchedAfter[i] - fetched[i]
			upload = max(upload, servedAfter[i]-served[i])
		}
		eg := f.TakeEgress(b)
		copies += float64(eg.Bytes) / float64(img.Bytes)
		gets = max(gets, eg.MaxGets())
		fi, me, la := fleet.Spread(took)
		first, median, last = first+fi.Seconds(), median+me.Seconds(), last+la.Seconds()
	}
	runs := float64(b.N)
	b.ReportMetric(copies/runs, "registry-copies")
	b.ReportMetric(float64(gets), "blob-gets/digest")
	b.ReportMetric(first/runs, "first-node-s")
	b.ReportMetric(median/runs, "median-node-s")
	b.ReportMetric(last/runs, "last-node-s")
	b.ReportMetric(fromPeers/runs/float64(int64(len(nodes))*(img.ConfigSize+img.LayerBytes())), "peer-share")
	b.ReportMetric(upload/(1<<20), "max-upload-MiB")
}

// peerBytes reads each node's blob bytes fetched from and served to its
// peers; 0 on nodes without peers.
func peerBytes(b *testing.B, nodes []*fleet.Node) (fetched, served []float64) {
	for _, n := range nodes {
		fetched = append(fetched, n.Metric(b, "pullwise_peer_bytes_fetched_total"))
		served = append(served, n.Metric(b, "pullwise_peer_bytes_served_total"))
	}
	return fetched, served
}
