package gunzip

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/typeurl/v2"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// BenchmarkLayerFromFile inflates a 16 MiB layer read as containerd's
// applier reads it, from a content store file where every Read is a
// pread: whole (into kept buffers, or into fresh memory; told the blob's
// size or not), streamed with read-ahead, and by containerd's own
// decompression. It reports the
// process's CPU time per layer, read-ahead goroutines included: wall time
// alone would hide what the overlap costs.
func BenchmarkLayerFromFile(b *testing.B) {
	tarball := textTar(b, 16<<20)
	path := filepath.Join(b.TempDir(), "blob")
	if err := os.WriteFile(path, gzipped(b, tarball), 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	// As Pullwise's unpacking applies a layer: told the blob's size
	// (WithBlobSize); unsized, as a layer applied by another path is.
	ctx := context.Background()
	sized := payloadsOf(b, ocispec.Descriptor{Size: fi.Size()})
	handler := func(payloads map[string]typeurl.Any) func(io.Reader) (io.ReadCloser, error) {
		return func(r io.Reader) (io.ReadCloser, error) {
			start, _ := Handler(ctx, ocispec.MediaTypeImageLayerGzip)
			return start(ctx, diff.NewProcessorChain(ocispec.MediaTypeImageLayerGzip, r), payloads)
		}
	}
	for _, tc := range []struct {
		name     string
		streamed bool
		// fresh gives back every kept buffer before each layer, as on a
		// node's first pulls: the layer writes into memory new to it.
		fresh bool
		open  func(io.Reader) (io.ReadCloser, error)
	}{
		{"whole", false, false, handler(sized)},
		{"whole-fresh", false, true, handler(sized)},
		{"whole-unsized", false, false, handler(nil)},
		{"whole-unsized-fresh", false, true, handler(nil)},
		{"read-ahead", true, false, handler(sized)},
		{"containerd", false, false, func(r io.Reader) (io.ReadCloser, error) { return compression.DecompressStream(r) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.streamed {
				set(b, &maxTar, -1)
			}
			b.Cleanup(func() { unmapAllKept() })
			b.SetBytes(int64(len(tarball)))
			// The tar reader beneath containerd's applier copies in 32 KiB.
			buf := make([]byte, 32<<10)
			layer := func() {
				rc, err := tc.open(io.NewSectionReader(f, 0, fi.Size()))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{rc}, buf); err != nil {
					b.Fatal(err)
				}
				rc.Close()
			}
			// One layer before the count, so that the kept buffers the
			// other cases measure are kept already.
			layer()
			b.ReportAllocs()
			cpu0 := processCPU(b)
			for b.Loop() {
				if tc.fresh {
					unmapAllKept()
				}
				layer()
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// textTar is a tar stream of one file of n bytes of words, which gzip
// shrinks about fivefold, near the benchmark registry's text-like layers.
func textTar(b *testing.B, n int) []byte {
	words := strings.Fields("layer image pull node registry mirror blob digest manifest config pod kubelet containerd snapshot unpack gzip tar the a of to and in")
	r := rand.New(rand.NewChaCha8([32]byte{2}))
	var body bytes.Buffer
	for body.Len() < n {
		body.WriteString(words[r.IntN(len(words))])
		body.WriteByte(" \n"[r.IntN(2)])
	}
	return tarOf(b, body.Bytes())
}
