package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/integration/registry"
)

// TestLargeLayerWrittenWhileItArrives pulls through CRI images whose
// second layer is a blob of over 64 MiB, served at 16 MiB/s, which
// Pullwise writes while it arrives (transfer/early, docs/pull-gate.md).
// Each image's root filesystem must be the image's, its blob in the
// content store with its distribution source, and the daemon must say
// the layer was written while it arrived, its writer having waited for
// bytes still on the way. A body cut off once is resumed with a range
// request, and the spool follows it. A body cut off and then refused
// fails the pull, as a failed fetch would; the pull asked again resumes
// what the store kept of the blob.
func TestLargeLayerWrittenWhileItArrives(t *testing.T) {
	e := newEnv(t, envOptions{logLevel: "debug", transfer: "  max_concurrent_unpacks = 2"})
	requireOverlayfs(t, e)
	c, err := client.New(e.d.Socket, client.WithDefaultNamespace("k8s.io"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })

	const cut = 16 << 20
	// rate is well below what a busy CPU writes a layer at, so that its
	// writer waits for bytes: at 48 MiB/s, on two CPUs with a build
	// beside it, the writer once never waited for bytes (starved=0s).
	const rate = 16 << 20
	cases := []struct {
		name string
		// fault disturbs the big blob's requests, the first being 0.
		fault      func(n int64) *registry.Fault
		failsFirst bool
	}{
		{name: "healthy"},
		{name: "cut off once", fault: func(n int64) *registry.Fault {
			if n == 0 {
				return &registry.Fault{BytesPerSecond: rate, TruncateAfter: cut}
			}
			return nil
		}},
		{name: "cut off then refused", fault: func(n int64) *registry.Fault {
			if n == 0 {
				return &registry.Fault{BytesPerSecond: rate, TruncateAfter: cut}
			}
			return &registry.Fault{Status: http.StatusServiceUnavailable}
		}, failsFirst: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			repo := "early/" + strings.ReplaceAll(tc.name, " ", "-")
			big := make([]byte, 66<<20) // random: its blob is as large
			rand.Read(big)
			img := e.push(repo, "v1", registry.Image{FileLayers: []map[string][]byte{
				{"/etc/small": []byte("small")},
				{"/opt/big": big, "/opt/note": []byte("note")},
			}})
			layer := img.Layers[1]
			if img.LayerSizes[1] < 64<<20 {
				t.Fatalf("the big layer's blob is %d bytes, under the 64 MiB written while arriving", img.LayerSizes[1])
			}
			var asked atomic.Int64
			e.upstream.SetFault(func(r registry.Request) *registry.Fault {
				if r.Kind != registry.KindBlob || r.Reference != layer.String() {
					return nil
				}
				n := asked.Add(1) - 1
				if tc.fault != nil {
					if f := tc.fault(n); f != nil {
						return f
					}
				}
				return &registry.Fault{BytesPerSecond: rate}
			})
			t.Cleanup(func() { e.upstream.SetFault(nil) })

			_, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, nil)
			if tc.failsFirst {
				if err == nil {
					t.Fatal("the pull whose big blob was refused succeeded")
				}
				e.upstream.SetFault(nil)
				_, err = e.images.PullImage(context.Background(), criImage(img.Ref), nil, nil)
			}
			if err != nil {
				t.Fatalf("PullImage %s: %v", img.Ref, err)
			}

			root, _ := e.mountImage("k8s.io", img.Ref, "overlayfs")
			got := rootTree(t, root)
			if got["etc/small"] != "small" || got["opt/note"] != "note" || !bytes.Equal([]byte(got["opt/big"]), big) {
				t.Errorf("unpacked root filesystem lacks the image's files (opt/big %d bytes of %d)", len(got["opt/big"]), len(big))
			}
			info, err := c.ContentStore().Info(context.Background(), layer)
			if err != nil {
				t.Fatalf("the big layer's blob is not in the content store: %v", err)
			}
			// containerd's key names the host without its port.
			host, _, _ := net.SplitHostPort(e.upstream.Host())
			if src := info.Labels["containerd.io/distribution.source."+host]; src != repo {
				t.Errorf("the big layer's distribution source is %q, want %q (labels %v)", src, repo, info.Labels)
			}
			if tc.failsFirst {
				return
			}
			starved, ok := writtenWhileArriving(e.d.Log(), layer)
			if !ok {
				t.Fatalf("containerd did not say it wrote layer %s while it arrived", layer)
			}
			if starved <= 0 {
				t.Errorf("the layer's writer never waited for bytes (starved=%s): it started after the last byte", starved)
			}
		})
	}
}

// writtenWhileArriving finds containerd's debug line for a layer written
// while it arrived, and how long its writer waited for bytes.
func writtenWhileArriving(log string, layer digest.Digest) (time.Duration, bool) {
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, "layer written while it arrived") || !strings.Contains(line, layer.String()) {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "starved="); ok {
				d, err := time.ParseDuration(v)
				return d, err == nil
			}
		}
	}
	return 0, false
}
