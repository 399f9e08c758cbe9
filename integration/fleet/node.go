package fleet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	contentapi "github.com/containerd/containerd/api/services/content/v1"
	leasesapi "github.com/containerd/containerd/api/services/leases/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	internalapi "k8s.io/cri-api/pkg/apis"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"

	"github.com/pullwise/pullwise/integration/daemon"
)

// Node is one containerd in its own network namespace.
type Node struct {
	Name   string // "n0", "n1", …
	IP     string // its address on the bridge
	NetNS  string // its namespace's name
	Daemon *daemon.Daemon
	// Images is kubelet's CRI image client on the node's socket.
	Images internalapi.ImageManagerService
	conn   *grpc.ClientConn
}

// AddNode starts a containerd in a new namespace on the bridge, with
// opts as daemon.Start takes them: Binary picks the arm (bin/containerd
// when empty, or bin/containerd-stock), ExtraConfig adds to its config.
// HostsDir defaults to the fleet's, which names the registry as a
// plain-HTTP host.
func (f *Fleet) AddNode(t testing.TB, opts daemon.Options) *Node {
	t.Helper()
	i := f.nodes
	f.nodes++
	if i >= 240 {
		t.Fatal("a fleet has at most 240 nodes")
	}
	n := &Node{Name: fmt.Sprintf("n%d", i), IP: nodeIP(i)}
	n.NetNS = f.ID + "-" + n.Name
	if err := f.addNamespace(n.NetNS); err != nil {
		t.Fatal(err)
	}
	if err := link(f.hub, n.Name, n.NetNS, n.IP+subnet); err != nil {
		t.Fatal(err)
	}
	if opts.HostsDir == "" {
		opts.HostsDir = f.HostsDir
	}
	if opts.Binary == "" {
		opts.Binary = daemon.Bin("containerd")
	}
	opts.Binary = inNetNS(t, n.NetNS, opts.Binary)
	n.Daemon = daemon.Start(t, opts)
	n.connect(t)
	return n
}

// inNetNS writes a script that runs bin in namespace ns and returns its
// path, for daemon.Start to run as the daemon's binary. nsenter --net
// switches the network namespace only: unlike `ip netns exec`, which
// also makes a mount namespace and mounts a new /sys, it leaves
// containerd's mounts where the daemon harness unmounts them, and
// /sys/fs/cgroup where containerd looks. Both exec, so the daemon's PID
// is containerd's: signals, CPU time and restarts work as elsewhere.
// PATH starts with bin's directory, as the harness would have it, for
// the shim.
func inNetNS(t testing.TB, ns, bin string) string {
	t.Helper()
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\nPATH=%q:\"$PATH\"; export PATH\nexec %q --net=%q -- %q \"$@\"\n",
		filepath.Dir(bin), nsenter, netnsDir+ns, bin)
	p := filepath.Join(t.TempDir(), filepath.Base(bin))
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func (n *Node) connect(t testing.TB) {
	t.Helper()
	var err error
	n.Images, err = remote.NewRemoteImageService(context.Background(), n.Daemon.Endpoint(), 10*time.Second, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	n.conn, err = grpc.NewClient(n.Daemon.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.conn.Close() })
}

// Pull pulls ref through CRI, as kubelet does.
func (n *Node) Pull(ctx context.Context, ref string) error { return n.PullWith(ctx, ref, nil) }

// PullWith pulls ref through CRI with auth, as kubelet does with a pod's
// pull secret.
func (n *Node) PullWith(ctx context.Context, ref string, auth *criapi.AuthConfig) error {
	if _, err := n.Images.PullImage(ctx, &criapi.ImageSpec{Image: ref}, auth, nil); err != nil {
		return fmt.Errorf("node %s: pull %s: %w", n.Name, ref, err)
	}
	return nil
}

// PullSource is what `crictl inspecti` shows for ref: the pull source
// (KEP-4589) and, as JSON, the bytes each host served.
func (n *Node) PullSource(t testing.TB, ref string) (source, blobs string) {
	t.Helper()
	st, err := n.Images.ImageStatus(context.Background(), &criapi.ImageSpec{Image: ref}, true)
	if err != nil {
		t.Fatalf("node %s: image status %s: %v", n.Name, ref, err)
	}
	if st.GetImage() == nil {
		t.Fatalf("node %s has no image %s", n.Name, ref)
	}
	return st.GetInfo()["pullSource"], st.GetInfo()["pullSourceBlobs"]
}

// Has reports whether blob d is in the node's content store.
func (n *Node) Has(t testing.TB, d digest.Digest) bool {
	t.Helper()
	_, err := contentapi.NewContentClient(n.conn).Info(criNamespace(), &contentapi.InfoRequest{Digest: d.String()})
	if status.Code(err) == codes.NotFound {
		return false
	}
	if err != nil {
		t.Fatalf("node %s: content info %s: %v", n.Name, d, err)
	}
	return true
}

// Clean removes img through CRI and collects the garbage at once, then
// checks that none of its blobs is left: the next pull starts empty.
func (n *Node) Clean(t testing.TB, img Image) {
	t.Helper()
	ctx := context.Background()
	if err := n.Images.RemoveImage(ctx, &criapi.ImageSpec{Image: img.Ref}); err != nil && status.Code(err) != codes.NotFound {
		t.Fatalf("node %s: remove %s: %v", n.Name, img.Ref, err)
	}
	// What the node kept for its peers goes too (transfer/peers/keep).
	// Deleting a lease with Sync runs containerd's GC before it answers.
	leases := leasesapi.NewLeasesClient(n.conn)
	kept, err := leases.List(criNamespace(), &leasesapi.ListRequest{Filters: []string{`labels."io.pullwise.peers.keep"==true`}})
	if err != nil {
		t.Fatalf("node %s: list leases: %v", n.Name, err)
	}
	for _, l := range kept.GetLeases() {
		if _, err := leases.Delete(criNamespace(), &leasesapi.DeleteRequest{ID: l.GetID()}); err != nil {
			t.Fatalf("node %s: delete lease %s: %v", n.Name, l.GetID(), err)
		}
	}
	l, err := leases.Create(criNamespace(), &leasesapi.CreateRequest{})
	if err != nil {
		t.Fatalf("node %s: create lease: %v", n.Name, err)
	}
	if _, err := leases.Delete(criNamespace(), &leasesapi.DeleteRequest{ID: l.GetLease().GetID(), Sync: true}); err != nil {
		t.Fatalf("node %s: delete lease (sync GC): %v", n.Name, err)
	}
	for _, d := range img.Blobs() {
		if n.Has(t, d) {
			t.Fatalf("node %s still has blob %s after removing %s", n.Name, d, img.Ref)
		}
	}
}

// criNamespace is the containerd namespace CRI keeps images in.
func criNamespace() context.Context {
	return namespaces.WithNamespace(context.Background(), "k8s.io")
}
