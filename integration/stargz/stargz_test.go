package stargz

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// TestStockLazyPull proves the harness: a stock containerd with the stargz
// snapshotter as proxy plugin CRI-pulls an eStargz image without fetching
// a single layer blob itself, and the snapshotter mounts every layer
// remotely, fetching from the registry on its own.
func TestStockLazyPull(t *testing.T) {
	// make unit lists this package too, without binaries: it runs only
	// where they are named, e.g.
	// PULLWISE_BIN=$PWD/bin go test ./integration/stargz/.
	if os.Getenv("PULLWISE_BIN") == "" {
		t.Skip("needs PULLWISE_BIN naming bin/ with containerd-stock and containerd-stargz-grpc (make containerd-stock stargz)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: containerd and the snapshotter mount")
	}
	if err := FUSE(); err != nil {
		t.Skip(err)
	}
	reg := registry.Start(t, registry.Options{Name: "upstream"})
	img := reg.PushEStargz(t, "lazy/estargz", "v1", registry.Image{Layers: []int64{1 << 20, 3 << 20}, Seed: 7100})
	reg.Reset()
	hosts := t.TempDir()
	if err := registry.WriteHosts(hosts, reg.Host(), reg.URL(), ""); err != nil {
		t.Fatal(err)
	}

	sn := Start(t, t.TempDir())
	d := daemon.Start(t, daemon.Options{
		Binary:         daemon.Bin("containerd-stock"),
		HostsDir:       hosts,
		Snapshotter:    Name,
		NoUnpackConfig: true,
		CRIImages:      CRIImages,
		ExtraConfig:    sn.ProxyPlugin(),
	})

	conn, err := grpc.NewClient(d.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := criapi.NewImageServiceClient(conn).PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: img.Ref}}); err != nil {
		t.Fatalf("PullImage %s: %v", img.Ref, err)
	}

	// containerd: the manifest and the config, no layer.
	for _, r := range reg.Requests() {
		t.Logf("registry: %s %s %s %d %dB (%s)", r.Method, r.Kind, r.Reference, r.Status, r.Bytes, r.Header.Get("User-Agent"))
		if r.FromContainerd() && r.Kind == registry.KindBlob && slices.Contains(img.Layers, digest.Digest(r.Reference)) {
			t.Errorf("containerd fetched layer %s itself: %s %s", r.Reference, r.Method, r.Path)
		}
	}
	if n := reg.Count(func(r registry.Request) bool { return r.FromContainerd() && r.Kind == registry.KindManifest }); n == 0 {
		t.Error("no manifest request from containerd")
	}
	if n := reg.Count(func(r registry.Request) bool {
		return !r.FromContainerd() && r.Kind == registry.KindBlob && slices.Contains(img.Layers, digest.Digest(r.Reference))
	}); n == 0 {
		t.Error("the snapshotter fetched no layer data from the registry")
	}

	// The snapshotter: every layer a committed remote snapshot.
	var remote int
	for _, info := range sn.Snapshots(t) {
		t.Logf("stargz snapshot %s kind=%v remote=%v", info.Name, info.Kind, IsRemote(info))
		if IsRemote(info) {
			remote++
		}
	}
	if remote != len(img.Layers) {
		t.Errorf("%d remote snapshots, want one per layer (%d)", remote, len(img.Layers))
	}
	if n := strings.Count(d.Log(), "skip extraction"); n != len(img.Layers) {
		t.Errorf("containerd skipped extraction of %d layers, want %d", n, len(img.Layers))
	}
}
