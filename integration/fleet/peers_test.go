package fleet_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/fleet"
	"github.com/pullwise/pullwise/integration/registry"
	"github.com/pullwise/pullwise/internal/await"
)

// TestFleetPeers: 4 Pullwise nodes with peers on pull one image through
// CRI, one after the other, then another all at once. The first takes it from the registry and
// the others take every blob from their peers: the registry sends each
// blob once, every node names the registry as the image's source (the
// manifest is always the registry's) and its peers as where its blobs
// came from, and the blobs are in every node's content store. All at
// once, the registry sends at most 1.3 copies.
func TestFleetPeers(t *testing.T) {
	f := fleet.New(t, fleet.Options{})
	nodes := withPeers(t, f, 4, daemon.Options{})

	img := f.Push(t, "fleet/app", "peers", registry.Image{Layers: []int64{3 << 20, 2 << 20, 1 << 20}, Seed: 4300})
	eg := oneAfterAnother(t, f, nodes, img)
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

	// All at once: each blob's owner has one node fetch it from the
	// registry while the others follow that download as it arrives.
	img = f.Push(t, "fleet/app", "peers-at-once", registry.Image{Layers: []int64{3 << 20, 2 << 20, 1 << 20}, Seed: 4301})
	if _, err := fleet.Rollout(t.Context(), nodes, img.Ref, fleet.Simultaneous); err != nil {
		t.Fatal(err)
	}
	eg = f.TakeEgress(t)
	copies := float64(eg.Bytes) / float64(img.Bytes)
	t.Logf("at once: registry sent %.3f copies of the image to %d nodes, %d GETs of a blob at most", copies, len(nodes), eg.MaxGets())
	if copies > 1.3 {
		t.Errorf("registry sent %.3f copies of the image to %d nodes pulling at once, want at most 1.3", copies, len(nodes))
	}
	for _, n := range nodes {
		source, _ := n.PullSource(t, img.Ref)
		if source != img.Ref {
			t.Errorf("node %s: pull source %q, want %q", n.Name, source, img.Ref)
		}
		for _, d := range img.Blobs() {
			if !n.Has(t, d) {
				t.Errorf("node %s: blob %s not in its content store", n.Name, d)
			}
		}
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

// TestFleetPeerFaults: peers that cannot serve a blob as they should cost
// a node nothing but a trip to the registry. Each case starts with node
// n0 holding an image and announcing its blobs.
//   - n0's copy of a layer is corrupt on disk: n1's pull succeeds with the
//     registry's copy of that layer, and counts the peer's bytes as corrupt;
//   - a private image: n1, without the pull secret n0 used, gets an
//     Unauthenticated answer and nothing from its peers (the manifest
//     always comes from the registry, with the node's own credentials);
//   - n0 is killed: n2's pull succeeds from the registry.
func TestFleetPeerFaults(t *testing.T) {
	f := fleet.New(t, fleet.Options{})
	nodes := withPeers(t, f, 3, daemon.Options{})
	creds := &registry.BasicAuth{User: "fleet", Password: "s3cret"}
	seed := int64(4400)
	// held has n0 pull a new image, with auth, and announce its blobs; a
	// private repository asks for auth once the image is pushed.
	held := func(t *testing.T, repo string, auth *criapi.AuthConfig) fleet.Image {
		seed++
		img := f.Push(t, repo, fmt.Sprint(seed), registry.Image{Layers: []int64{2 << 20, 1 << 20}, Seed: seed})
		if repo == "fleet/private" {
			f.Registry.SetFault(registry.When(func(r registry.Request) bool { return r.Repo == repo },
				&registry.Fault{RequireBasicAuth: creds}))
			t.Cleanup(func() { f.Registry.SetFault(nil) })
		}
		nodes[0].PullAndAnnounce(t, img, auth)
		f.TakeEgress(t)
		return img
	}

	t.Run("corrupt", func(t *testing.T) {
		img := held(t, "fleet/app", nil)
		bad := img.Layers[0]
		path := filepath.Join(nodes[0].Daemon.Root, "io.containerd.content.v1.content", "blobs", bad.Algorithm().String(), bad.Encoded())
		flipFirstByte(t, path)
		corrupt := `pullwise_peer_fetch_failures_total{reason="corrupt"}`
		before := nodes[1].Metric(t, corrupt)
		if err := nodes[1].Pull(t.Context(), img.Ref); err != nil {
			t.Fatal(err)
		}
		if got := nodes[1].Metric(t, corrupt) - before; got < 1 {
			t.Errorf("n1 counted %v corrupt peer fetches, want at least 1", got)
		}
		eg := f.TakeEgress(t)
		for _, d := range img.Blobs() {
			want := 0
			if d == bad {
				want = 1
			}
			if got := eg.BlobGets[d]; got != want {
				t.Errorf("registry: %d GETs of blob %s, want %d", got, d, want)
			}
		}
		if !nodes[1].Has(t, bad) {
			t.Errorf("n1 has no layer %s", bad)
		}
		// pullctl registries on n1: the peer that lied is down.
		down := 0
		for _, h := range nodes[1].Registries(t) {
			if h.GetKind() == "peer" && h.GetState() == "down" && strings.HasPrefix(h.GetHost(), "peer://") {
				down++
			}
		}
		if down != 1 {
			t.Errorf("n1 lists %d peers down, want the one that sent wrong bytes", down)
		}
	})

	t.Run("private image", func(t *testing.T) {
		img := held(t, "fleet/private", &criapi.AuthConfig{Username: creds.User, Password: creds.Password})
		fetched := nodes[1].Metric(t, "pullwise_peer_bytes_fetched_total")
		for _, auth := range []*criapi.AuthConfig{nil, {Username: creds.User, Password: "wrong"}} {
			err := nodes[1].PullWith(t.Context(), img.Ref, auth)
			if status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
				t.Errorf("n1 pull with %v: %v, want Unauthenticated", auth, err)
			}
		}
		if got := nodes[1].Metric(t, "pullwise_peer_bytes_fetched_total") - fetched; got != 0 {
			t.Errorf("n1 fetched %v bytes from peers for an image it may not pull", got)
		}
		for _, d := range img.Blobs() {
			if nodes[1].Has(t, d) {
				t.Errorf("n1 has blob %s of an image it may not pull", d)
			}
		}
	})

	t.Run("peer killed", func(t *testing.T) {
		img := held(t, "fleet/app", nil)
		nodes[0].Daemon.Kill(t)
		if err := nodes[2].Pull(t.Context(), img.Ref); err != nil {
			t.Fatal(err)
		}
		eg := f.TakeEgress(t)
		for _, d := range img.Blobs() {
			if got := eg.BlobGets[d]; got != 1 {
				t.Errorf("registry: %d GETs of blob %s, want 1: n2's", got, d)
			}
		}
	})
}

// flipFirstByte corrupts the blob at path in place, its size unchanged,
// as a failing disk would: containerd reads it back without checking.
func flipFirstByte(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
}

// TestFleetPeersDiscardUnpackedLayers: nodes set as EKS, GKE and Talos
// set CRI (discard_unpacked_layers) let a layer blob go once unpacked;
// with peers on, each node keeps what it pulled for its peers a while
// (keep_for, keep_bytes), so a rollout still costs the registry one copy.
func TestFleetPeersDiscardUnpackedLayers(t *testing.T) {
	f := fleet.New(t, fleet.Options{})
	nodes := withPeers(t, f, 3, daemon.Options{CRIImages: "discard_unpacked_layers = true"})
	img := f.Push(t, "fleet/app", "discard", registry.Image{Layers: []int64{2 << 20, 1 << 20}, Seed: 4500})
	oneAfterAnother(t, f, nodes, img)
	for _, n := range nodes[1:] {
		assertFromPeers(t, n, img)
	}
}

// TestFleetPeerMidBlob: the peer serving a blob stops mid-blob. Stalled
// (SIGSTOP), the fetching node gives it up after read_timeout; killed,
// at once. Either way its pull succeeds with the registry's bytes, and
// counts the peer's failure.
func TestFleetPeerMidBlob(t *testing.T) {
	f := fleet.New(t, fleet.Options{})
	cfg := f.PeersConfig(t) + "  read_timeout = \"1s\"\n"
	// n0 serves slowly, so that its peers' fetches are under way when it
	// stops.
	nodes := []*fleet.Node{f.AddNode(t, daemon.Options{LogLevel: "info", ExtraConfig: cfg + "  upload_bytes_per_second = 1048576\n"})}
	for range 2 {
		nodes = append(nodes, f.AddNode(t, daemon.Options{LogLevel: "info", ExtraConfig: cfg}))
	}
	fleet.AwaitMesh(t, nodes)
	for i, tc := range []struct {
		name   string
		node   *fleet.Node
		stop   func(t *testing.T)
		reason []string // pullwise_peer_fetch_failures_total reasons, one of which counts
	}{
		{name: "stalled", node: nodes[1], stop: func(t *testing.T) {
			pid := nodes[0].Daemon.PID()
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
		}, reason: []string{"stalled"}},
		{name: "killed", node: nodes[2], stop: func(t *testing.T) { nodes[0].Daemon.Kill(t) }, reason: []string{"broken", "stalled", "dial"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := f.Push(t, "fleet/app", "mid-"+tc.name, registry.Image{Layers: []int64{4 << 20}, Seed: int64(4600 + i)})
			nodes[0].PullAndAnnounce(t, img, nil)
			f.TakeEgress(t)
			failures := func() (n float64) {
				for _, r := range tc.reason {
					n += tc.node.Metric(t, `pullwise_peer_fetch_failures_total{reason="`+r+`"}`)
				}
				return n
			}
			failed, served := failures(), nodes[0].Metric(t, "pullwise_peer_bytes_served_total")
			pulled := make(chan error, 1)
			go func() { pulled <- tc.node.Pull(t.Context(), img.Ref) }()
			await.Until(t, 30*time.Second, "n0 to be serving the layer", func() bool {
				return nodes[0].Metric(t, "pullwise_peer_bytes_served_total")-served > 0
			})
			tc.stop(t)
			if err := <-pulled; err != nil {
				t.Fatal(err)
			}
			if got := failures() - failed; got < 1 {
				t.Errorf("%s counted no peer failure (%v)", tc.node.Name, tc.reason)
			}
			for _, d := range img.Blobs() {
				if !tc.node.Has(t, d) {
					t.Errorf("%s: blob %s not in its content store", tc.node.Name, d)
				}
			}
			if eg := f.TakeEgress(t); eg.BlobGets[img.Layers[0]] != 1 {
				t.Errorf("registry: %d GETs of the layer, want 1: the node's, after its peer stopped", eg.BlobGets[img.Layers[0]])
			}
		})
	}
}

// oneAfterAnother rolls img out to nodes one after the other, the first
// announcing its blobs before the next pulls, and checks that the
// registry sent each blob once for them all.
func oneAfterAnother(t *testing.T, f *fleet.Fleet, nodes []*fleet.Node, img fleet.Image) fleet.Egress {
	t.Helper()
	nodes[0].PullAndAnnounce(t, img, nil)
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
	return eg
}

// withPeers adds n nodes with peers on to f, with opts, and waits until
// they know each other.
func withPeers(t *testing.T, f *fleet.Fleet, n int, opts daemon.Options) []*fleet.Node {
	t.Helper()
	opts.LogLevel, opts.ExtraConfig = "info", f.PeersConfig(t)
	nodes := make([]*fleet.Node, n)
	for i := range nodes {
		nodes[i] = f.AddNode(t, opts)
	}
	fleet.AwaitMesh(t, nodes)
	return nodes
}
