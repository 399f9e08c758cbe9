package gunzip

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unsafe"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/typeurl/v2"
	"github.com/klauspost/compress/zstd"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"go.uber.org/goleak"

	"github.com/pullwise/pullwise/transfer/lane"
)

// layerTar is a tar stream of one file of n bytes, half random and half
// repeated, so it spans several read-ahead blocks and still compresses.
func layerTar(t testing.TB, n int) []byte {
	t.Helper()
	body := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	_, _ = r.Read(body[:n/2])
	for i := n / 2; i < n; i++ {
		body[i] = "layer "[i%6]
	}
	return tarOf(t, body)
}

// tarOf is a tar stream of one file, f, holding body.
func tarOf(t testing.TB, body []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, parts ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, p := range parts {
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(p); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func zstded(t *testing.T, p []byte) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(p, nil)
}

// uncompress runs blob through the handler as containerd's applier does:
// a processor chain from the descriptor's media type.
func uncompress(t *testing.T, mediaType string, blob []byte) ([]byte, error) {
	t.Helper()
	out, _, err := uncompressFrom(t, nil, mediaType, bytes.NewReader(blob))
	return out, err
}

// uncompressFrom is uncompress from any reader, with the apply's
// payloads, and says whether the layer was inflated whole.
func uncompressFrom(t *testing.T, payloads map[string]typeurl.Any, mediaType string, r io.Reader) (out []byte, whole bool, err error) {
	t.Helper()
	ctx := context.Background()
	start, ok := Handler(ctx, mediaType)
	if !ok {
		t.Fatalf("Handler(%s) did not claim the layer", mediaType)
	}
	p, err := start(ctx, diff.NewProcessorChain(mediaType, r), payloads)
	if err != nil {
		return nil, false, err
	}
	if p.MediaType() != ocispec.MediaTypeImageLayer {
		t.Errorf("media type after processing = %s, want %s", p.MediaType(), ocispec.MediaTypeImageLayer)
	}
	whole = inflatedWhole(p)
	out, err = io.ReadAll(p)
	// Close repeats a read error; containerd's applier ignores it.
	if cerr := p.Close(); err == nil && cerr != nil {
		t.Errorf("close: %v", cerr)
	}
	return out, whole, err
}

func inflatedWhole(p diff.StreamProcessor) bool {
	pp, ok := p.(*processor)
	if !ok {
		return false
	}
	_, whole := pp.ReadCloser.(inflated)
	return whole
}

// eachWay runs f with layers inflated whole where they fit, then with
// every gzip layer streamed, and checks each way gives back all the
// memory it took. whole tells f whether the first way is on in this build.
func eachWay(t *testing.T, f func(t *testing.T, whole bool)) {
	t.Helper()
	run := func(t *testing.T, whole bool) {
		f(t, whole)
		budgetAllFree(t)
	}
	t.Run("whole", func(t *testing.T) { run(t, wholeLayers) })
	t.Run("streamed", func(t *testing.T) {
		set(t, &maxTar, -1)
		run(t, false)
	})
}

// set sets *v to x for the rest of the test.
func set(t testing.TB, v *int, x int) {
	old := *v
	*v = x
	t.Cleanup(func() { *v = old })
}

// TestMain checks the Handler starts off, as the transfer plugin relies
// on when it is disabled, then turns it on for the tests, as the plugin
// does by default.
func TestMain(m *testing.M) {
	if _, claimed := Handler(context.Background(), ocispec.MediaTypeImageLayerGzip); claimed {
		fmt.Fprintln(os.Stderr, "Handler claimed a gzip layer before Enable(true)")
		os.Exit(1)
	}
	Enable(true)
	os.Exit(m.Run())
}

func TestUncompressedLayerIsTheTarStream(t *testing.T) {
	defer goleak.VerifyNone(t)
	a, b := layerTar(t, 3<<20+17), layerTar(t, 1000)
	cases := []struct {
		name      string
		mediaType string
		blob      []byte
		want      []byte
		whole     bool // inflated whole, where layers can be
	}{
		{"oci gzip layer", ocispec.MediaTypeImageLayerGzip, gzipped(t, a), a, true},
		{"docker gzip layer", images.MediaTypeDockerSchema2LayerGzip, gzipped(t, a), a, true},
		// libdeflate inflates one member; the stream reads them all.
		{"two gzip members", ocispec.MediaTypeImageLayerGzip, gzipped(t, a, b), append(append([]byte{}, a...), b...), false},
		{"empty file", ocispec.MediaTypeImageLayerGzip, gzipped(t, []byte{}), []byte{}, true},
		// Media types can lie; stock containerd goes by the bytes.
		{"gzip type, plain tar bytes", ocispec.MediaTypeImageLayerGzip, b, b, false},
		{"gzip type, zstd bytes", ocispec.MediaTypeImageLayerGzip, zstded(t, a), a, false},
		{"oci zstd layer", ocispec.MediaTypeImageLayerZstd, zstded(t, a), a, false},
		{"zstd type, plain tar bytes", ocispec.MediaTypeImageLayerZstd, b, b, false},
		{"oci uncompressed layer", ocispec.MediaTypeImageLayer, a, a, false},
		{"docker uncompressed layer", images.MediaTypeDockerSchema2Layer, b, b, false},
	}
	eachWay(t, func(t *testing.T, whole bool) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				got, gotWhole, err := uncompressFrom(t, nil, c.mediaType, bytes.NewReader(c.blob))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, c.want) {
					t.Fatalf("got %d bytes, want the %d bytes of the tar stream", len(got), len(c.want))
				}
				if want := whole && c.whole; gotWhole != want {
					t.Errorf("inflated whole: %t, want %t", gotWhole, want)
				}
			})
		}
	})
}

// TestLargeLayersAreStreamed: a layer beyond the bounds of what is
// inflated whole, or met when the budget is spent, is streamed from what
// was read of it and the rest.
func TestLargeLayersAreStreamed(t *testing.T) {
	defer goleak.VerifyNone(t)
	random := make([]byte, 3<<20)
	_, _ = rand.NewChaCha8([32]byte{3}).Read(random)
	incompressible := tarOf(t, random) // its blob is over 3 MiB
	text := layerTar(t, 3<<20)
	cases := []struct {
		name  string
		tar   []byte
		limit func(t *testing.T)
		whole bool
	}{
		{"within the bounds", text, func(*testing.T) {}, true},
		{"blob over maxBlob", incompressible, func(t *testing.T) { set(t, &maxBlob, 1<<20) }, false},
		{"tar over maxTar", text, func(t *testing.T) { set(t, &maxTar, 2<<20) }, false},
		{"budget spent", text, func(t *testing.T) {
			unmapAllKept()
			if !budget.TryAcquire(budgetSize - 1<<20) {
				t.Fatal("budget in use before the test")
			}
			t.Cleanup(func() { budget.Release(budgetSize - 1<<20) })
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.limit(t)
			got, whole, err := uncompressFrom(t, nil, ocispec.MediaTypeImageLayerGzip, bytes.NewReader(gzipped(t, c.tar)))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.tar) {
				t.Fatalf("got %d bytes, want the %d bytes of the tar stream", len(got), len(c.tar))
			}
			if want := c.whole && wholeLayers; whole != want {
				t.Errorf("inflated whole: %t, want %t", whole, want)
			}
		})
	}
	budgetAllFree(t)
}

// TestKnownBlobSize: told its blob's size (WithBlobSize), a layer is read into
// one buffer of that size, and one too large to read whole is not read
// into memory at all. The size is a hint: a stream of another length is
// still read to its end.
func TestKnownBlobSize(t *testing.T) {
	defer goleak.VerifyNone(t)
	tarball := layerTar(t, 3<<20)
	blob := gzipped(t, tarball)
	size := int64(len(blob))
	cases := []struct {
		name  string
		size  int64 // what the payloads say
		limit int   // maxBlob
		whole bool
		// mapped is how many buffers the layer mapped: the blob's and
		// the tar stream's when inflated whole.
		mapped int
	}{
		{"known", size, maxBlob, true, 2},
		{"not known", 0, maxBlob, true, 3}, // 1 MiB, then 2 MiB, for a blob over 1 MiB
		{"known, over maxBlob", size, int(size) - 1, false, 0},
		{"told too little", size / 2, maxBlob, true, 3}, // 1 MiB filled, then 2 MiB
		{"told one byte", 1, maxBlob, true, 3},          // the same: the 1 MiB buffer filled first
		{"told too much", 2 * size, maxBlob, true, 2},
	}
	if size <= 1<<minBufShift || size > 2<<minBufShift {
		t.Fatalf("the blob is %d bytes; the cases count buffers for a blob between 1 and 2 MiB", size)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			set(t, &maxBlob, c.limit)
			unmapAllKept()
			payloads := payloadsOf(t, ocispec.Descriptor{Size: c.size})
			got, whole, err := uncompressFrom(t, payloads, ocispec.MediaTypeImageLayerGzip, bytes.NewReader(blob))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tarball) {
				t.Fatalf("got %d bytes, want the %d bytes of the tar stream", len(got), len(tarball))
			}
			if want := c.whole && wholeLayers; whole != want {
				t.Errorf("inflated whole: %t, want %t", whole, want)
			}
			// Every buffer a layer maps is kept when it closes; a build
			// without libdeflate maps none.
			want := c.mapped
			if !wholeLayers {
				want = 0
			}
			if n := unmapAllKept(); n != want {
				t.Errorf("the layer mapped %d buffers, want %d", n, want)
			}
		})
	}
}

// payloadsOf is what WithBlobSize gives desc's stream processors, as an
// applier passes them on, beside a payload of another processor's that
// must be kept.
func payloadsOf(t testing.TB, desc ocispec.Descriptor) map[string]typeurl.Any {
	t.Helper()
	other := map[string]typeurl.Any{"another.processor": sizePayload(-1)}
	c := diff.ApplyConfig{ProcessorPayloads: other}
	if err := WithBlobSize()(context.Background(), desc, &c); err != nil {
		t.Fatal(err)
	}
	if c.ProcessorPayloads["another.processor"] == nil {
		t.Fatal("WithBlobSize dropped another processor's payload")
	}
	if len(other) != 1 {
		t.Fatal("WithBlobSize wrote into the payloads it was given, which other layers may share")
	}
	return c.ProcessorPayloads
}

// budgetAllFree fails the test unless every layer has given its memory
// back to the budget: all of it is kept for later layers or free.
func budgetAllFree(t *testing.T) {
	t.Helper()
	unmapAllKept()
	if !budget.TryAcquire(budgetSize) {
		t.Fatal("layers closed, and memory of the budget is still held")
	}
	budget.Release(budgetSize)
}

// TestUnreadableLayerFails: the content store failing under a layer is
// the layer's error, and the memory taken to read it is given back.
func TestUnreadableLayerFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	errDisk := errors.New("disk gone")
	blob := gzipped(t, layerTar(t, 2<<20))
	eachWay(t, func(t *testing.T, _ bool) {
		r := io.MultiReader(bytes.NewReader(blob[:len(blob)/2]), iotest.ErrReader(errDisk))
		if _, _, err := uncompressFrom(t, nil, ocispec.MediaTypeImageLayerGzip, r); !errors.Is(err, errDisk) {
			t.Fatalf("err = %v, want %v", err, errDisk)
		}
	})
}

func TestBrokenLayerFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	good := gzipped(t, layerTar(t, 2<<20))
	flipped := bytes.Clone(good)
	flipped[len(flipped)-6] ^= 0xff // in the CRC-32 of the trailer
	cases := []struct {
		name string
		blob []byte
		want error
	}{
		{"truncated", good[:len(good)/2], io.ErrUnexpectedEOF},
		{"cut before the trailer", good[:len(good)-8], io.ErrUnexpectedEOF},
		{"checksum mismatch", flipped, gzip.ErrChecksum},
	}
	// Inflated whole or streamed, a broken layer fails as it did
	// streamed: libdeflate's failure hands it to the stream.
	eachWay(t, func(t *testing.T, _ bool) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				_, err := uncompress(t, ocispec.MediaTypeImageLayerGzip, c.blob)
				if err == nil {
					t.Fatal("a broken layer uncompressed without error")
				}
				if c.want != nil && !errors.Is(err, c.want) && err.Error() != c.want.Error() {
					t.Fatalf("err = %v, want %v", err, c.want)
				}
			})
		}
	})
}

// TestNextLayerAfterAnEndedOne: readers are kept for the next layer
// however the last one ended, and must not carry anything over to it.
func TestNextLayerAfterAnEndedOne(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	next := layerTar(t, 3<<20+5)
	nextBlob := gzipped(t, next)
	good := gzipped(t, layerTar(t, 2<<20))
	flipped := bytes.Clone(good)
	flipped[len(flipped)-6] ^= 0xff
	cases := []struct {
		name string
		end  func(t *testing.T)
	}{
		{"read whole", func(t *testing.T) { _, _ = uncompress(t, ocispec.MediaTypeImageLayerGzip, good) }},
		{"checksum mismatch", func(t *testing.T) { _, _ = uncompress(t, ocispec.MediaTypeImageLayerGzip, flipped) }},
		{"truncated", func(t *testing.T) { _, _ = uncompress(t, ocispec.MediaTypeImageLayerGzip, good[:len(good)/2]) }},
		// An unpack that fails or is cancelled closes a layer half read;
		// goleak checks the read-ahead stops.
		{"closed after a few bytes", func(t *testing.T) {
			start, _ := Handler(ctx, ocispec.MediaTypeImageLayerGzip)
			p, err := start(ctx, diff.NewProcessorChain(ocispec.MediaTypeImageLayerGzip, bytes.NewReader(good)), nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(p, make([]byte, 10)); err != nil {
				t.Fatal(err)
			}
			_ = p.Close()
			if _, err := p.Read(make([]byte, 1)); err == nil {
				t.Error("read after close succeeded")
			}
		}},
		{"closed unread", func(t *testing.T) {
			start, _ := Handler(ctx, ocispec.MediaTypeImageLayerGzip)
			p, err := start(ctx, diff.NewProcessorChain(ocispec.MediaTypeImageLayerGzip, bytes.NewReader(good)), nil)
			if err != nil {
				t.Fatal(err)
			}
			_ = p.Close()
		}},
	}
	eachWay(t, func(t *testing.T, _ bool) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				// Several rounds: the pool may drop what it is given.
				for range 4 {
					c.end(t)
					got, err := uncompress(t, ocispec.MediaTypeImageLayerGzip, nextBlob)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(got, next) {
						t.Fatalf("got %d bytes, want the %d bytes of the next layer", len(got), len(next))
					}
				}
			})
		}
	})
}

// A closed reader is parked on emptyGzip; were it not a gzip stream, no
// reader would be kept.
func TestEmptyGzipIsAnEmptyStream(t *testing.T) {
	z, err := gzip.NewReader(bytes.NewReader(emptyGzip))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(z); err != nil || len(b) != 0 {
		t.Fatalf("read %d bytes, err %v; want none and no error", len(b), err)
	}
}

func TestOtherLayersAreLeftToContainerd(t *testing.T) {
	ctx := context.Background()
	Enable(false)
	_, claimedGzip := Handler(ctx, ocispec.MediaTypeImageLayerGzip)
	_, claimedZstd := Handler(ctx, ocispec.MediaTypeImageLayerZstd)
	_, claimedTar := Handler(ctx, ocispec.MediaTypeImageLayer)
	Enable(true)
	if claimedGzip || claimedZstd || claimedTar {
		t.Error("Handler claimed a layer while turned off")
	}
	for _, mt := range []string{
		images.MediaTypeImageLayerGzipEncrypted,
		"application/octet-stream",
	} {
		if _, ok := Handler(ctx, mt); ok {
			t.Errorf("Handler claimed %s", mt)
		}
	}
}

// TestEveryLayerIsPaced: whatever its compression, a layer applied in a
// lane is read through its Pacer, which holds its writing back for the
// pulls ahead (lane's TestPacer).
func TestEveryLayerIsPaced(t *testing.T) {
	defer goleak.VerifyNone(t)
	a := layerTar(t, 1<<20)
	for _, c := range []struct {
		mediaType string
		blob      []byte
	}{
		{ocispec.MediaTypeImageLayerGzip, gzipped(t, a)},
		{ocispec.MediaTypeImageLayerZstd, zstded(t, a)},
		{ocispec.MediaTypeImageLayer, a},
		{images.MediaTypeDockerSchema2Layer, a},
	} {
		t.Run(c.mediaType, func(t *testing.T) {
			ctx := lane.WithTicket(context.Background(), lane.NewTicket(time.Now()))
			applier := lane.Applier{Applier: opening{mediaType: c.mediaType, blob: c.blob}, Lane: lane.Overtaking(1, lane.Slack)}
			if _, err := applier.Apply(ctx, ocispec.Descriptor{MediaType: c.mediaType}, nil); err != nil {
				t.Fatal(err)
			}
		})
	}
	budgetAllFree(t)
}

// opening applies a layer as containerd's applier does, through the
// processor Handler gives its media type, and fails unless that processor
// reads through the layer's Pacer.
type opening struct {
	mediaType string
	blob      []byte
}

func (o opening) Apply(ctx context.Context, _ ocispec.Descriptor, _ []mount.Mount, _ ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	start, ok := Handler(ctx, o.mediaType)
	if !ok {
		return ocispec.Descriptor{}, fmt.Errorf("%s left to containerd", o.mediaType)
	}
	sp, err := start(ctx, diff.NewProcessorChain(o.mediaType, bytes.NewReader(o.blob)), nil)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	defer sp.Close()
	if _, err := io.Copy(io.Discard, sp); err != nil {
		return ocispec.Descriptor{}, err
	}
	if p, ok := sp.(*processor); !ok || p.pace == nil || p.pace != lane.PacerOf(ctx) {
		return ocispec.Descriptor{}, fmt.Errorf("%s not read through its Pacer", o.mediaType)
	}
	return ocispec.Descriptor{}, nil
}

// unmapAllKept gives back the memory kept for later layers, and says how
// many buffers it unmapped.
func unmapAllKept() (n int) {
	for unmapKept() {
		n++
	}
	return n
}

// TestKeptBuffers: a buffer given back is the next one of its size; kept
// buffers of another size are unmapped to make room, so that what they
// hold and what layers hold never passes the budget.
func TestKeptBuffers(t *testing.T) {
	unmapAllKept()
	const big = 64 << 20
	var bufs []*[]byte
	for b := getBuf(big); b != nil; b = getBuf(big) {
		bufs = append(bufs, b)
	}
	if int64(len(bufs)) != budgetSize/big {
		t.Fatalf("%d buffers of 64 MiB from a budget of %d MiB", len(bufs), budgetSize>>20)
	}
	for _, b := range bufs {
		putBuf(b)
	}
	small := getBuf(16 << 20)
	if small == nil {
		t.Fatal("the budget, full of kept buffers of another size, had no room")
	}
	putBuf(small)
	if again := getBuf(10 << 20); again != small {
		t.Fatal("a buffer of the size of one kept was not the kept one")
	}
	putBuf(small)
	budgetAllFree(t)
}

// TestBuffersAskForHugePages: a whole layer's buffers are advised huge
// (hugePages), so that where the kernel gives huge pages to those who ask,
// writing a layer faults once per 2 MiB rather than once per 4 KiB. The
// kernel marks a mapping so advised "hg" in /proc/self/smaps.
func TestBuffersAskForHugePages(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage"); err != nil {
		t.Skip("this kernel has no transparent huge pages to ask for")
	}
	unmapAllKept()
	t.Cleanup(func() { unmapAllKept() })
	b := getBuf(4 << 20)
	if b == nil {
		t.Fatal("no buffer from an unused budget")
	}
	defer putBuf(b)
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(*b))))
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	// An entry starts with its range ("7f12a0000000-7f12a0400000 rw-p
	// ..."); its fields follow, each named with a colon, VmFlags last.
	var mine bool
	for _, line := range strings.Split(string(smaps), "\n") {
		first, _, _ := strings.Cut(line, " ")
		if lo, hi, ok := strings.Cut(first, "-"); ok && !strings.HasSuffix(first, ":") {
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			mine = err1 == nil && err2 == nil && start <= addr && addr < end
			continue
		}
		if flags, ok := strings.CutPrefix(line, "VmFlags:"); ok && mine {
			if !slices.Contains(strings.Fields(flags), "hg") {
				t.Errorf("the buffer's mapping has VmFlags:%s, without hg (MADV_HUGEPAGE)", flags)
			}
			return
		}
	}
	t.Fatalf("no mapping in /proc/self/smaps holds the buffer at %#x", addr)
}
