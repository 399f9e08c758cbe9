package corpus

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/pullwise/pullwise/integration/daemon"
)

// Built is a corpus image as built: its layers' digests and compressed
// sizes, for the link's bound.
type Built struct {
	Name   string
	Image  v1.Image
	Layers map[string]int64 // digest: compressed size
	Bytes  int64
}

// String describes b's size on the wire: "1502 MiB in 7 layers, the
// largest 695 MiB".
func (b Built) String() string {
	var largest int64
	for _, size := range b.Layers {
		largest = max(largest, size)
	}
	return fmt.Sprintf("%d MiB in %d layers, the largest %d MiB", b.Bytes>>20, len(b.Layers), largest>>20)
}

// Summary describes a burst of imgs in one line: "16 images, 1067 MiB in
// 31 layers; the largest giant, 1037 MiB in 16 layers, the largest 713
// MiB".
func Summary(imgs []Built) string {
	if len(imgs) == 0 {
		return "no images"
	}
	var bytes int64
	var layers int
	for _, img := range imgs {
		bytes += img.Bytes
		layers += len(img.Layers)
	}
	largest := slices.MaxFunc(imgs, func(a, b Built) int { return cmp.Compare(a.Bytes, b.Bytes) })
	return fmt.Sprintf("%d images, %d MiB in %d layers; the largest %s, %s", len(imgs), bytes>>20, layers, largest.Name, largest)
}

// Describe logs what a burst of imgs pulls in one line (Summary), and
// each image with PULLWISE_BENCH_VERBOSE: go test keeps only ten lines of
// a benchmark's log, and a sub-benchmark's, since its parent prints no
// log of its own.
func Describe(t testing.TB, imgs []Built) {
	t.Helper()
	for _, img := range imgs {
		daemon.Verbosef(t, "%s: %s", img.Name, img)
	}
	t.Logf("%s", Summary(imgs))
}

// CacheDir is where layers are kept between runs: PULLWISE_CORPUS_CACHE,
// or the user's cache directory.
func CacheDir() (string, error) {
	if dir := os.Getenv("PULLWISE_CORPUS_CACHE"); dir != "" {
		return dir, nil
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "pullwise", "corpus"), nil
}

// Load builds the images of scenario from this machine's trees, with the
// layer cache of CacheDir. Every image but the pause image itself gets
// the pause binary as its top layer, one layer all share, so that each
// runs as a pod's container.
func Load(pause []byte, scenario func(Trees) []Image) ([]Built, error) {
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	pauseDir := filepath.Join(cache, "pause")
	if err := os.MkdirAll(pauseDir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(pauseDir, "pause"), pause, 0o755); err != nil {
		return nil, err
	}
	trees, err := LocalTrees(pauseDir)
	if err != nil {
		return nil, err
	}
	var out []Built
	for _, img := range scenario(trees) {
		if img.Name != "pause" {
			img.Layers = append(img.Layers, Layer{{Dir: trees.Pause}})
		}
		image, err := Build(cache, img)
		if err != nil {
			return nil, err
		}
		b := Built{Name: img.Name, Image: image, Layers: map[string]int64{}}
		layers, err := image.Layers()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", img.Name, err)
		}
		for _, l := range layers {
			d, err := l.Digest()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", img.Name, err)
			}
			size, err := l.Size()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", img.Name, err)
			}
			b.Layers[d.String()] = size
			b.Bytes += size
		}
		out = append(out, b)
	}
	return out, nil
}

// UniqueBytes is what pulling imgs moves over the link: each layer once.
func UniqueBytes(imgs []Built) int64 {
	seen := map[string]bool{}
	var n int64
	for _, img := range imgs {
		for d, size := range img.Layers {
			if !seen[d] {
				seen[d] = true
				n += size
			}
		}
	}
	return n
}
