// Package gunzip decompresses gzip image layers for containerd's layer
// appliers: whole, with libdeflate, where a layer fits in memory, and
// otherwise streamed through klauspost/pgzip in place of compress/gzip.
// zstd layers pass through it too, inflated as containerd would, and
// uncompressed ones as they are, so that every layer's writing can give
// way (lane.Pacer).
//
// Unpacking a layer is one goroutine in containerd: it inflates the blob,
// hashes the tar stream (the diff ID) and writes the files, one after the
// other. Inflating is a third to a half of that CPU, and on a node that
// pulls many images at once the CPUs are what every pull waits for.
//
// A layer's blob is in the content store before it is applied, so most
// layers can be read into memory and inflated in one call: libdeflate
// does that in a fraction of the CPU time klauspost/compress takes to
// stream it (BenchmarkLayerFromFile). whole.go bounds the memory, and asks
// for it in huge pages: in 4 KiB pages, inflating a layer whole into
// memory new to the daemon cost more than streaming it, in page faults,
// on a paravirtualized guest (BenchmarkLayerFromFile, whole-fresh).
//
// A layer too large for that is streamed: pgzip inflates ahead of the
// reader in a goroutine of its own, so the layer's unpacking can use a
// second CPU. containerd already inflates with klauspost/compress, the
// same inflater pgzip uses, so nothing is saved per byte: the gain is the
// overlap. With readers and their blocks kept from layer to layer, the
// handing of blocks between goroutines costs about nothing more.
//
// Either way the tar stream and its digest are unchanged: the unpacker
// still checks every layer against the diff ID in the image config.
package gunzip

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/typeurl/v2"
	"github.com/klauspost/pgzip"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/lane"
)

// Read-ahead per layer being applied: blocks of blockSize inflated bytes.
// Four of 1 MiB keep the inflater a few milliseconds ahead of the tar
// writer at 4 MiB of memory per layer, which is what pgzip defaults to.
const (
	blockSize = 1 << 20
	blocks    = 4
)

// readBuffer is what the inflater reads the compressed layer through.
// Each fill is a pread on the content store's file: 32 KiB, as
// containerd's own decompression reads, makes an eighth of the calls
// bufio's default 4 KiB did.
const readBuffer = 32 << 10

var gzipMagic = []byte{0x1f, 0x8b}

// on is process-wide, as diff.RegisterProcessor is.
var on atomic.Bool

// Enable turns Handler on or off. It starts off, so that registering it
// changes nothing until the transfer plugin, once it has loaded, turns it
// on: with that plugin disabled, gzip layers stay with containerd. Off,
// gzip layers go to containerd's own decompression.
func Enable(enable bool) { on.Store(enable) }

// Handler claims layers whose media type says gzip, zstd or uncompressed.
// Register it with diff.RegisterProcessor before containerd's server
// starts: the stream_processors of its config are registered after, and
// so still come first for the media types they name.
func Handler(_ context.Context, mediaType string) (diff.StreamProcessorInit, bool) {
	if !on.Load() {
		return nil, false
	}
	switch {
	case gzipLayers[mediaType]:
		return open, true
	case zstdLayers[mediaType]:
		return openZstd, true
	case tarLayers[mediaType]:
		return openTar, true
	}
	return nil, false
}

// gzipLayers are the media types of gzip layers. Types with more after
// "gzip", such as encrypted layers, stay with whatever handles them: not
// images.DiffCompression, which sorts a type's suffixes and so reads
// tar+gzip+encrypted as gzip.
var gzipLayers = map[string]bool{
	ocispec.MediaTypeImageLayerGzip:                 true,
	ocispec.MediaTypeImageLayerNonDistributableGzip: true, //nolint:staticcheck // still served
	images.MediaTypeDockerSchema2LayerGzip:          true,
	images.MediaTypeDockerSchema2LayerForeignGzip:   true,
}

// zstdLayers are the media types of zstd layers. containerd inflates them
// fast enough (several times gzip's speed) that nothing is gained by
// reading them whole; they come here only so that their writing gives way
// like a gzip layer's (lane.Pacer).
var zstdLayers = map[string]bool{
	ocispec.MediaTypeImageLayerZstd:                 true,
	ocispec.MediaTypeImageLayerNonDistributableZstd: true, //nolint:staticcheck // still served
}

// tarLayers are the media types of uncompressed layers. Nothing is
// inflated; they come here only so that their writing gives way like a
// compressed layer's (lane.Pacer): containerd passes them through a
// processor of its own that reads on regardless.
var tarLayers = map[string]bool{
	ocispec.MediaTypeImageLayer:                 true,
	ocispec.MediaTypeImageLayerNonDistributable: true, //nolint:staticcheck // still served
	images.MediaTypeDockerSchema2Layer:          true,
	images.MediaTypeDockerSchema2LayerForeign:   true,
}

// openTar passes an uncompressed layer through, paced. Like containerd's
// own processor for them, it leaves the stream beneath to its owner to
// close.
func openTar(ctx context.Context, stream diff.StreamProcessor, _ map[string]typeurl.Any) (diff.StreamProcessor, error) {
	pace := lane.PacerOf(ctx)
	if err := pace.Wait(ctx); err != nil {
		return nil, err
	}
	return &processor{ReadCloser: io.NopCloser(stream), ctx: ctx, pace: pace}, nil
}

// openZstd streams a zstd layer through containerd's own decompression,
// paced.
func openZstd(ctx context.Context, stream diff.StreamProcessor, _ map[string]typeurl.Any) (diff.StreamProcessor, error) {
	pace := lane.PacerOf(ctx)
	if err := pace.Wait(ctx); err != nil {
		return nil, err
	}
	ds, err := compression.DecompressStream(bufio.NewReaderSize(stream, readBuffer))
	if err != nil {
		return nil, fmt.Errorf("zstd layer: %w", err)
	}
	return &processor{ReadCloser: ds, ctx: ctx, pace: pace}, nil
}

func open(ctx context.Context, stream diff.StreamProcessor, payloads map[string]typeurl.Any) (diff.StreamProcessor, error) {
	pace := lane.PacerOf(ctx)
	if err := pace.Wait(ctx); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(stream, readBuffer)
	if magic, err := br.Peek(len(gzipMagic)); err != nil || !bytes.Equal(magic, gzipMagic) {
		// The media type says gzip and the bytes do not: leave it to
		// containerd's detection, as stock containerd would.
		ds, err := compression.DecompressStream(br)
		if err != nil {
			return nil, err
		}
		return &processor{ReadCloser: ds, ctx: ctx, pace: pace}, nil
	}
	p := &processor{ctx: ctx, pace: pace}
	tar, compressed, err := readWhole(br, BlobSizeFrom(payloads), &p.held)
	if err != nil {
		return nil, fmt.Errorf("read gzip layer: %w", err)
	}
	if tar != nil {
		p.ReadCloser = inflated{tar}
		return p, nil
	}
	z, err := newReader(compressed)
	if err != nil {
		p.held.releaseAll()
		return nil, fmt.Errorf("gzip layer: %w", err)
	}
	p.ReadCloser = z
	return p, nil
}

// readers keeps closed readers with their blocks for the next layer. A
// new reader allocates its blocks, 4 MiB a layer: in a burst of pulls
// that is hundreds of MiB for the garbage collector, and fresh memory the
// inflater faults in as it writes each block. Reset keeps the blocks.
var readers sync.Pool

func newReader(r io.Reader) (*pgzip.Reader, error) {
	z, ok := readers.Get().(*pgzip.Reader)
	if !ok {
		return pgzip.NewReaderN(r, blockSize, blocks)
	}
	if err := z.Reset(r); err != nil {
		// Only the header was read: no read-ahead runs, and no block is
		// out of the reader.
		readers.Put(z)
		return nil, err
	}
	return z, nil
}

// processor is the uncompressed layer. Close stops pgzip's goroutines and
// waits for them; containerd's applier closes it before the content reader
// beneath.
type processor struct {
	io.ReadCloser // a *pgzip.Reader, the layer inflated whole, or containerd's decompression
	held          held
	// pace holds the layer's writing back while pulls due well before
	// it are unpacking (lane.Pacer); the tar writer, and the inflater
	// ahead of it, stop with the reads.
	pace *lane.Pacer
	ctx  context.Context
}

func (p *processor) Read(b []byte) (int, error) {
	if err := p.pace.Wait(p.ctx); err != nil {
		return 0, err
	}
	return p.ReadCloser.Read(b)
}

// Close ends the read-ahead and keeps the reader for the next layer.
//
// It resets the reader onto an empty gzip stream rather than closing it:
// pgzip v1.3.0 closes a channel a second time, and panics, when a reader
// closed in the middle of a stream is reset. Reset ends the read-ahead as
// Close does (its goroutines are done and every block is back in the
// reader's pool when it returns) and leaves nothing running to end again.
// The inflate error Close would repeat was already returned by Read.
func (p *processor) Close() error {
	// The read-ahead reads from memory held, if any: it ends first.
	defer p.held.releaseAll()
	z, ok := p.ReadCloser.(*pgzip.Reader)
	if !ok {
		err := p.ReadCloser.Close()
		p.ReadCloser = closed{}
		return err
	}
	p.ReadCloser = closed{}
	if err := z.Reset(bytes.NewReader(emptyGzip)); err == nil {
		readers.Put(z)
	}
	return nil
}

// emptyGzip is a gzip stream of no bytes: a header, an empty final
// deflate block and a trailer of zero CRC and size.
var emptyGzip = []byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0}

// inflated is a layer's tar stream inflated whole, in memory the processor
// holds.
type inflated struct{ *bytes.Reader }

func (inflated) Close() error { return nil }

// closed is a processor's stream after Close.
type closed struct{}

func (closed) Read([]byte) (int, error) { return 0, os.ErrClosed }
func (closed) Close() error             { return nil }

func (*processor) MediaType() string { return ocispec.MediaTypeImageLayer }
