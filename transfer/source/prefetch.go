package source

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/transfer"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// maxPrefetched bounds each manifest a waiting pull keeps in memory. Image
// manifests and indexes are a few KiB; a pull whose are larger waits
// without a size, in the order it was asked.
const maxPrefetched = 1 << 20

// Prefetch resolves the pull's reference, unless desc already is its
// descriptor, and fetches the image manifest it would unpack, choosing
// from an index with platform as containerd's images.Manifest does. It is
// for a pull waiting for a slot: its size is then known while it waits,
// and once it runs, containerd gets those manifests from memory (Fetcher
// serves each once) instead of asking the registry again. Should the pull
// choose another manifest, containerd fetches that one from the registry,
// and the size was only a guess. It returns the reference's descriptor
// and the image's layers that present says are not on the node, less
// leading layers whose snapshots exist, as unpacked counts them (see
// OnUnpacked; nil counts none): what the pull will fetch.
func (f *Fetcher) Prefetch(ctx context.Context, desc ocispec.Descriptor, platform platforms.MatchComparer, present func(digest.Digest) bool, unpacked Unpacked) (ocispec.Descriptor, []ocispec.Descriptor, error) {
	if desc.Digest == "" {
		var err error
		if _, desc, err = f.Resolve(ctx); err != nil {
			return desc, nil, fmt.Errorf("resolve %s: %w", f.ref, err)
		}
	}
	fetcher, err := f.resolver.Fetcher(ctx, f.ref)
	if err != nil {
		return desc, nil, fmt.Errorf("fetcher for %s: %w", f.ref, err)
	}
	p := &manifestProvider{fetcher: fetcher, got: map[digest.Digest][]byte{}}
	m, err := images.Manifest(ctx, p, desc, platform)
	if err != nil {
		return desc, nil, fmt.Errorf("image manifest of %s: %w", f.ref, err)
	}
	f.mu.Lock()
	f.prefetched = p.got
	f.mu.Unlock()
	skip := 0
	if unpacked != nil {
		n, _ := unpacked(m.Config.Digest, m.Layers)
		skip = min(n, len(m.Layers))
	}
	var missing []ocispec.Descriptor
	for _, l := range m.Layers[skip:] {
		if !present(l.Digest) {
			missing = append(missing, l)
		}
	}
	return desc, missing, nil
}

// Bytes adds up the sizes of blobs.
func Bytes(blobs []ocispec.Descriptor) int64 {
	var n int64
	for _, b := range blobs {
		n += b.Size
	}
	return n
}

// manifestProvider lets containerd's images.Manifest walk from a
// reference's descriptor to the platform's image manifest over the
// registry, and keeps what it read. It serves only manifests and indexes:
// an index entry without a platform would have it read the image config
// to learn its platform, which is a blob, for containerd to fetch and
// count. Such a prefetch fails, and the pull fetches as usual.
type manifestProvider struct {
	fetcher transfer.Fetcher
	got     map[digest.Digest][]byte
}

func (p *manifestProvider) ReaderAt(ctx context.Context, d ocispec.Descriptor) (content.ReaderAt, error) {
	if !images.IsManifestType(d.MediaType) && !images.IsIndexType(d.MediaType) {
		return nil, fmt.Errorf("%s %s: not a manifest: %w", d.MediaType, d.Digest, errdefs.ErrNotFound)
	}
	b, err := fetchSmall(ctx, p.fetcher, d)
	if err != nil {
		return nil, err
	}
	p.got[d.Digest] = b
	return bytesReaderAt{bytes.NewReader(b)}, nil
}

// bytesReaderAt is a content.ReaderAt over bytes in memory.
type bytesReaderAt struct{ *bytes.Reader }

func (bytesReaderAt) Close() error { return nil }

// fetchSmall reads the manifest or index d, if it is at most maxPrefetched
// bytes and its digest is right: what containerd gets from memory must be
// what it would have checked on the wire.
func fetchSmall(ctx context.Context, fetcher transfer.Fetcher, d ocispec.Descriptor) ([]byte, error) {
	if d.Size > maxPrefetched {
		return nil, fmt.Errorf("manifest %s: %d bytes, more than a waiting pull keeps", d.Digest, d.Size)
	}
	// Checked by d's own algorithm, which registries may pick (sha512):
	// checked as sha256, such a manifest would never match.
	if err := d.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	rc, err := fetcher.Fetch(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("fetch manifest %s: %w", d.Digest, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, d.Size+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", d.Digest, err)
	}
	if int64(len(b)) != d.Size || d.Digest.Algorithm().FromBytes(b) != d.Digest {
		return nil, fmt.Errorf("manifest %s: the registry's bytes do not match", d.Digest)
	}
	return b, nil
}

// take hands out a prefetched manifest once, and forgets it.
func (f *Fetcher) take(d digest.Digest) ([]byte, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.prefetched[d]
	delete(f.prefetched, d)
	return b, ok
}

// prefetchedFetcher serves the manifests Prefetch fetched, once each, and
// leaves the rest to the registry. A watched pull learns them as it would
// from the wire.
type prefetchedFetcher struct {
	transfer.Fetcher
	f *Fetcher
}

func (p prefetchedFetcher) Fetch(ctx context.Context, d ocispec.Descriptor) (io.ReadCloser, error) {
	if b, ok := p.f.take(d.Digest); ok {
		p.f.rec.manifestBody(b)
		return io.NopCloser(bytes.NewReader(b)), nil
	}
	return p.Fetcher.Fetch(ctx, d)
}
