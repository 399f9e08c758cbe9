package implied

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/moby/sys/userns"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/pullwise/pullwise/transfer/layerdir"
)

// Applier applies the layers containerd unpacks in parallel itself, and
// every other layer through the Applier it wraps.
//
// containerd's applier (core/diff/apply) takes no archive options from its
// caller, and the tar headers are the only place that tells an implied
// directory from one a layer lists with the same mode and owner, so for
// these layers Applier does what it does for an overlay mount, plus a
// filter that records the headers' names. Everything else is the same:
// the stream processors (gzip, and an operator's own), the diff ID over the
// uncompressed stream, overlay whiteouts, progress, syncfs.
type Applier struct {
	diff.Applier
	Content content.Provider
	Dirs    *Dirs
}

// Apply implements diff.Applier.
func (a Applier) Apply(ctx context.Context, desc ocispec.Descriptor, mounts []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	upper, ok := parallelUpper(mounts)
	if !ok {
		return a.Applier.Apply(ctx, desc, mounts, opts...)
	}
	var config diff.ApplyConfig
	for _, o := range opts {
		if err := o(ctx, desc, &config); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("failed to apply config opt: %w", err)
		}
	}
	ra, err := a.Content.ReaderAt(ctx, desc)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("failed to get reader from content store: %w", err)
	}
	defer ra.Close()
	compressed := &counter{r: content.NewReader(ra), progress: config.Progress}
	defer compressed.done()

	processor := diff.NewProcessorChain(desc.MediaType, compressed)
	processors := []diff.StreamProcessor{processor}
	for {
		if processor, err = diff.GetProcessor(ctx, processor, config.ProcessorPayloads); err != nil {
			return ocispec.Descriptor{}, fmt.Errorf("failed to get stream processor for %s: %w", desc.MediaType, err)
		}
		processors = append(processors, processor)
		if processor.MediaType() == ocispec.MediaTypeImageLayer {
			break
		}
	}
	defer processor.Close()

	digester := digest.Canonical.Digester()
	tarStream := &counter{r: io.TeeReader(processor, digester.Hash())}
	var h headers
	if _, err := archive.Apply(ctx, upper, tarStream,
		archive.WithConvertWhiteout(archive.OverlayConvertWhiteout),
		archive.WithFilter(h.record)); err != nil {
		return ocispec.Descriptor{}, err
	}
	if config.SyncFs {
		if err := syncFs(upper); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	if _, err := io.Copy(io.Discard, tarStream); err != nil {
		return ocispec.Descriptor{}, err
	}
	for _, p := range processors {
		if ep, ok := p.(interface{ Err() error }); ok {
			if err := ep.Err(); err != nil {
				return ocispec.Descriptor{}, err
			}
		}
	}
	a.Dirs.put(upper, h.implied())
	return ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageLayer,
		Size:      tarStream.n,
		Digest:    digester.Digest(),
	}, nil
}

// Reads reports whether Applier applies a layer to mounts itself, reading
// its blob through its Content.
func Reads(mounts []mount.Mount) bool {
	_, ok := parallelUpper(mounts)
	return ok
}

// parallelUpper returns the directory a layer unpacked in parallel is
// applied to: containerd hands such a layer, above the first, an overlay
// mount with an upper directory and no lower ones (core/unpack's
// bindToOverlay). Its applier does not mount it in a user namespace, and
// neither does this one.
func parallelUpper(mounts []mount.Mount) (string, bool) {
	if len(mounts) != 1 || mounts[0].Type != "overlay" || userns.RunningInUserNS() {
		return "", false
	}
	if _, ok := layerdir.OverlayOption(mounts[0], "lowerdir="); ok {
		return "", false
	}
	return layerdir.OverlayOption(mounts[0], "upperdir=")
}

// headers records, from a layer's tar headers, the directories it lists
// and the ones its entries are in.
type headers struct {
	listed, parents map[string]bool
}

// record is an archive.Filter that accepts every entry. archive.Apply has
// cleaned hdr.Name already.
func (h *headers) record(hdr *tar.Header) (bool, error) {
	if h.listed == nil {
		h.listed, h.parents = map[string]bool{}, map[string]bool{}
	}
	name := strings.TrimPrefix(filepath.Join("/", hdr.Name), "/")
	if hdr.Typeflag == tar.TypeDir {
		h.listed[name] = true
	}
	for d := filepath.Dir(name); d != "." && d != "/" && !h.parents[d]; d = filepath.Dir(d) {
		h.parents[d] = true
	}
	return true, nil
}

// implied returns the directories entries are in that the layer does not
// list, parents first.
func (h *headers) implied() []string {
	var dirs []string
	for d := range h.parents {
		if !h.listed[d] {
			dirs = append(dirs, d)
		}
	}
	slices.Sort(dirs)
	return dirs
}

// counter counts the bytes read through it and, like containerd's applier,
// reports the count read so far to progress before each read and at the
// end.
type counter struct {
	r        io.Reader
	n        int64
	progress func(int64)
}

func (c *counter) Read(p []byte) (int, error) {
	if c.progress != nil {
		c.progress(c.n)
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *counter) done() {
	if c.progress != nil {
		c.progress(c.n)
	}
}

func syncFs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("failed to open %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("failed to syncfs for %s: %w", dir, err)
	}
	return nil
}
