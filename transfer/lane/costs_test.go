package lane

import (
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestCosts: a pull's cost is its layers' bytes at their kind's speed,
// which starts at the seed and follows the layers written.
func TestCosts(t *testing.T) {
	const mib = 1 << 20
	layer := func(mediaType string, size int64) []ocispec.Descriptor {
		return []ocispec.Descriptor{{MediaType: mediaType, Size: size}}
	}
	for _, tc := range []struct {
		name      string
		mediaType string
		want      time.Duration // for 40 MiB, at the seed
	}{
		{"gzip", ocispec.MediaTypeImageLayerGzip, time.Second},
		{"docker gzip", "application/vnd.docker.image.rootfs.diff.tar.gzip", time.Second},
		{"zstd", ocispec.MediaTypeImageLayerZstd, 40 * time.Second / 150},
		{"uncompressed", ocispec.MediaTypeImageLayer, 40 * time.Second / 300},
		{"docker uncompressed", "application/vnd.docker.image.rootfs.diff.tar", 40 * time.Second / 300},
		{"unknown costs as gzip", "application/vnd.example.layer.v1.tar+gzip+encrypted", time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NewCosts().Of(layer(tc.mediaType, 40*mib)); got.Round(time.Millisecond) != tc.want.Round(time.Millisecond) {
				t.Fatalf("cost %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("learned per kind", func(t *testing.T) {
		c := NewCosts()
		zstd := c.Of(layer(ocispec.MediaTypeImageLayerZstd, 40*mib))
		// gzip layers written at 10 MiB/s: the estimate moves towards it,
		// and zstd's stays.
		for range 30 {
			c.Wrote(ocispec.MediaTypeImageLayerGzip, 20*mib, 2*time.Second)
		}
		got := c.Of(layer(ocispec.MediaTypeImageLayerGzip, 40*mib))
		if got < 3900*time.Millisecond || got > 4*time.Second {
			t.Fatalf("gzip cost %v after layers at 10 MiB/s, want about 4s", got)
		}
		if after := c.Of(layer(ocispec.MediaTypeImageLayerZstd, 40*mib)); after != zstd {
			t.Fatalf("zstd cost moved from %v to %v on gzip layers", zstd, after)
		}
	})

	t.Run("tiny layers teach nothing", func(t *testing.T) {
		c := NewCosts()
		before := c.Of(layer(ocispec.MediaTypeImageLayerGzip, 40*mib))
		c.Wrote(ocispec.MediaTypeImageLayerGzip, 4096, time.Second)
		if after := c.Of(layer(ocispec.MediaTypeImageLayerGzip, 40*mib)); after != before {
			t.Fatalf("cost moved from %v to %v on a 4 KiB layer", before, after)
		}
	})

	t.Run("nil costs nothing", func(t *testing.T) {
		var c *Costs
		c.Wrote(ocispec.MediaTypeImageLayerGzip, 40*mib, time.Second)
		if got := c.Of(layer(ocispec.MediaTypeImageLayerGzip, 40*mib)); got != 0 {
			t.Fatalf("nil Costs: %v", got)
		}
	})
}

// TestCostsMetric: the estimates are scraped per kind.
func TestCostsMetric(t *testing.T) {
	c := NewCosts()
	for range 50 {
		c.Wrote(ocispec.MediaTypeImageLayerGzip, 10<<20, time.Second)
	}
	got := c.PerMiB()["gzip"]
	if got < 99*time.Millisecond || got > 101*time.Millisecond {
		t.Fatalf("gzip %v per MiB after layers at 10 MiB/s, want about 100ms", got)
	}
	if n := testutil.CollectAndCount(c, "pullwise_layer_write_seconds_per_mib"); n != 3 {
		t.Fatalf("%d series, want one per kind (gzip, zstd, tar)", n)
	}
}
