package integration

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"github.com/containerd/containerd/api/types"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// BenchmarkImageStore: how a node's costs grow with the images it holds,
// 1,000 and 5,000 records in CRI's namespace (names for one pulled image,
// as a node that keeps many tags would have), Pullwise against stock:
//   - restart: stop, start and CRI ready (pinning reconciles at start);
//   - repull: a CRI pull of an image present and unchanged;
//   - list: CRI ListImages, what kubelet and `crictl images` ask.
//
// Pullwise's `pullctl images` adds the pull source of each image on top of
// ListImages; it is reported for Pullwise alone.
func BenchmarkImageStore(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprintf("images=%d", n), func(b *testing.B) {
			stockBin := daemon.Bin("containerd-stock")
			if _, err := os.Stat(stockBin); err != nil {
				b.Fatalf("stock containerd missing (make bench builds it): %v", err)
			}
			pw := newEnv(b, envOptions{logLevel: "info"})
			c := contenders{pullwise: pw, stock: pw.sibling(daemon.Options{Binary: stockBin, LogLevel: "info"})}
			img := pw.upstream.Push(b, "bench/store", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 40000})
			ctx := context.Background()
			c.each(b, 0, func(_ string, e *env) {
				if _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); err != nil {
					b.Fatal(err)
				}
				e.createRecords(b, img.Ref, n)
				e.d.ReadyTimeout = 10 * time.Minute
			})
			restart, repull, list, pullctl := map[string]time.Duration{}, map[string]time.Duration{}, map[string]time.Duration{}, time.Duration(0)
			for i := 0; b.Loop(); i++ {
				c.each(b, i, func(name string, e *env) {
					start := time.Now()
					e.d.Restart(b)
					restart[name] += time.Since(start)

					start = time.Now()
					if _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); err != nil {
						b.Fatal(err)
					}
					repull[name] += time.Since(start)

					start = time.Now()
					imgs, err := e.images.ListImages(ctx, &criapi.ImageFilter{})
					if err != nil || len(imgs) == 0 {
						b.Fatalf("ListImages: %d images, %v", len(imgs), err)
					}
					list[name] += time.Since(start)

					if name == "pullwise" {
						start = time.Now()
						if out, err := e.pullctl("images"); err != nil {
							b.Fatalf("pullctl images: %v\n%s", err, out)
						}
						pullctl += time.Since(start)
					}
				})
			}
			nn := float64(b.N)
			for _, m := range []struct {
				name string
				d    map[string]time.Duration
			}{{"restart", restart}, {"repull", repull}, {"list", list}} {
				b.ReportMetric(m.d["stock"].Seconds()*1000/nn, "stock-"+m.name+"-ms")
				b.ReportMetric(m.d["pullwise"].Seconds()*1000/nn, "pullwise-"+m.name+"-ms")
				b.ReportMetric(float64(m.d["pullwise"])/float64(m.d["stock"]), m.name+"-ratio")
			}
			b.ReportMetric(pullctl.Seconds()*1000/nn, "pullctl-images-ms")
		})
	}
}

// createRecords adds n image records in CRI's namespace naming the image
// ref points to, through containerd's images API as `ctr images tag` would.
func (e *env) createRecords(b *testing.B, ref string, n int) {
	b.Helper()
	ctx := inNamespace("k8s.io")
	c := imagesapi.NewImagesClient(e.conn)
	got, err := c.Get(ctx, &imagesapi.GetImageRequest{Name: ref})
	if err != nil {
		b.Fatalf("get %s: %v", ref, err)
	}
	target := got.GetImage().GetTarget()
	for i := range n {
		if _, err := c.Create(ctx, &imagesapi.CreateImageRequest{Image: &imagesapi.Image{
			Name:   fmt.Sprintf("%s-%d", ref, i),
			Target: &types.Descriptor{MediaType: target.GetMediaType(), Digest: target.GetDigest(), Size: target.GetSize()},
			Labels: map[string]string{"io.cri-containerd.image": "managed"},
		}}); err != nil {
			b.Fatalf("create record %d: %v", i, err)
		}
	}
}
