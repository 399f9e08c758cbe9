package registry

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// epoch is the timestamp of every file, layer and config, so that content
// and digests depend only on Image.
var epoch = time.Unix(0, 0).UTC()

// Image describes a deterministic test image: the same Image always yields
// the same digests.
type Image struct {
	// Layers holds, per layer, the size of the single file it contains.
	Layers []int64
	// Seed varies the file contents; different seeds give different digests.
	Seed int64
	// Platform defaults to linux/runtime.GOARCH.
	Platform ocispec.Platform
	// Compressible fills files with text-like bytes and gzips them for
	// real, so unpacking costs CPU as with real images. Digests then also
	// depend on the Go version's compressor: use it for benchmarks, not for
	// pinned digests.
	Compressible bool
	// Files, when set, go into one more layer after Layers: path (absolute
	// or relative to /) to content, each a regular file with mode 0755 and
	// its parent directories, so an image can carry an executable.
	Files map[string][]byte
	// FileLayers go one layer each, in order, after Layers and Files, for
	// images whose later layers change what earlier ones put in place.
	// Keys are paths as in Files; the value says what the layer does there:
	//   - content: a regular file as in Files;
	//   - nil: delete the file or directory (an OCI whiteout, .wh.<name>);
	//   - nil on a path ending in "/": make that directory opaque
	//     (.wh..wh..opq), hiding what earlier layers put in it, but not the
	//     files this layer puts there.
	// Unlike in Files, nil is no empty file here: write []byte{} for one.
	// Parent directories get entries of mode 0755 owned by root, unless
	// FileLayerDirs or ImpliedDirs say otherwise.
	FileLayers []map[string][]byte
	// FileLayerDirs, optional, holds directory entries for FileLayers:
	// FileLayerDirs[i] for FileLayers[i], path (as in Files, a trailing "/"
	// allowed) to the mode and owner of its entry, written also when the
	// layer puts nothing in the directory. It may be shorter than
	// FileLayers.
	FileLayerDirs []map[string]Dir
	// ImpliedDirs leaves out of FileLayers every directory entry that
	// FileLayerDirs does not list, as some image builders do: a layer
	// with "/a/x" then has a/x but no a/, and the unpacker must create a/
	// or keep it as the layers below have it.
	ImpliedDirs bool
	// UncompressedFileLayers pushes FileLayers as plain tars, with the
	// OCI media type of an uncompressed layer, as some image builders
	// can (buildah --disable-compression).
	UncompressedFileLayers bool
	// Entrypoint and Cmd are set in the image config, e.g. to run a file
	// from Files.
	Entrypoint []string
	Cmd        []string
}

// Pushed describes an image written by Push.
type Pushed struct {
	Ref        string        // host/repo:tag
	Digest     digest.Digest // manifest
	Config     digest.Digest
	ConfigSize int64
	Layers     []digest.Digest // compressed layer blobs, in manifest order
	LayerSizes []int64         // compressed sizes, i.e. bytes on the wire
}

// LayerBytes is the total compressed size of all layers.
func (p Pushed) LayerBytes() int64 {
	var n int64
	for _, s := range p.LayerSizes {
		n += s
	}
	return n
}

// BuildImage assembles img as an OCI image (OCI manifest, config and gzip
// layer media types) without pushing it.
func BuildImage(img Image) (v1.Image, error) {
	plat := img.Platform
	if plat.OS == "" {
		plat.OS = "linux"
	}
	if plat.Architecture == "" {
		plat.Architecture = runtime.GOARCH
	}
	base, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		OS:           plat.OS,
		Architecture: plat.Architecture,
		Variant:      plat.Variant,
		OSVersion:    plat.OSVersion,
		Created:      v1.Time{Time: epoch},
		RootFS:       v1.RootFS{Type: "layers"},
		Config:       v1.Config{Entrypoint: img.Entrypoint, Cmd: img.Cmd},
	})
	if err != nil {
		return nil, fmt.Errorf("set image config: %w", err)
	}
	base = mutate.MediaType(base, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)

	adds := make([]mutate.Addendum, 0, len(img.Layers))
	for i, size := range img.Layers {
		layer, err := buildLayer(img.Seed, i, size, img.Compressible)
		if err != nil {
			return nil, fmt.Errorf("build layer %d: %w", i, err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: epoch}, CreatedBy: fmt.Sprintf("registry test layer %d", i)},
		})
	}
	if len(img.Files) > 0 {
		layer, err := buildFilesLayer(img.Files)
		if err != nil {
			return nil, fmt.Errorf("build files layer: %w", err)
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "registry test files"},
		})
	}
	if len(img.FileLayerDirs) > len(img.FileLayers) {
		return nil, fmt.Errorf("%d FileLayerDirs for %d FileLayers", len(img.FileLayerDirs), len(img.FileLayers))
	}
	if img.ImpliedDirs && len(img.FileLayers) == 0 {
		// It would change nothing: Files always has its parents.
		return nil, fmt.Errorf("ImpliedDirs without FileLayers")
	}
	for i, changes := range img.FileLayers {
		var dirs map[string]Dir
		if i < len(img.FileLayerDirs) {
			dirs = img.FileLayerDirs[i]
		}
		layer, err := buildChangesLayer(changes, dirs, img.ImpliedDirs)
		if err != nil {
			return nil, fmt.Errorf("build file layer %d: %w", i, err)
		}
		mediaType := types.OCILayer
		if img.UncompressedFileLayers {
			mediaType = types.OCIUncompressedLayer
			if layer, err = uncompressed(layer); err != nil {
				return nil, fmt.Errorf("file layer %d: %w", i, err)
			}
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: mediaType,
			History:   v1.History{Created: v1.Time{Time: epoch}, CreatedBy: fmt.Sprintf("registry test file layer %d", i)},
		})
	}
	out, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	return out, nil
}

// buildLayer makes a gzip tar holding one file of size pseudo-random bytes.
// Random bytes do not compress, so the blob is about as large as the file.
// gzip runs without compression and with an empty header: the output then
// depends only on the input, not on compressor tuning or the clock.
func buildLayer(seed int64, index int, size int64, compressible bool) (v1.Layer, error) {
	var buf bytes.Buffer
	level, src := gzip.NoCompression, contentSource(seed, index)
	if compressible {
		level, src = gzip.DefaultCompression, textSource(src)
	}
	zw, err := gzip.NewWriterLevel(&buf, level)
	if err != nil {
		return nil, fmt.Errorf("create gzip writer: %w", err)
	}
	tw := tar.NewWriter(zw)
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     fmt.Sprintf("layer-%d.bin", index),
		Mode:     0o644,
		Size:     size,
		ModTime:  epoch,
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("write tar header: %w", err)
	}
	if _, err := io.CopyN(tw, src, size); err != nil {
		return nil, fmt.Errorf("write file content: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("close gzip: %w", err)
	}
	return gzipLayer(buf.Bytes())
}

// gzipLayer wraps a gzip tar blob as an OCI layer.
func gzipLayer(blob []byte) (v1.Layer, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(blob)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("wrap layer: %w", err)
	}
	return layer, nil
}

// uncompressed is layer's tar stream as a layer of its own.
func uncompressed(layer v1.Layer) (v1.Layer, error) {
	rc, err := layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tar, err := io.ReadAll(rc)
	if err != nil {
		return nil, fmt.Errorf("read tar stream: %w", err)
	}
	return static.NewLayer(tar, types.OCIUncompressedLayer), nil
}

// contentSource is a byte stream determined by (seed, index). ChaCha8's
// Read yields the same stream regardless of how reads are split.
func contentSource(seed int64, index int) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[0:], uint64(seed))
	binary.LittleEndian.PutUint64(key[8:], uint64(index))
	return rand.NewChaCha8(key)
}

// textSource turns random bytes into words from a small vocabulary: text
// that gzip shrinks about threefold, like typical image layers.
func textSource(r io.Reader) io.Reader {
	return &wordReader{r: bufio.NewReaderSize(r, 4096)}
}

var vocabulary = strings.Fields("the of and to in is for on that with as by at from this be are or an it " +
	"config layer image registry mirror pull push node pod container runtime snapshot digest manifest " +
	"lib usr bin share local etc var log cache python go java node ruby perl shell script binary")

// wordReader draws one random byte per word. r is buffered: the source's
// stream does not depend on how reads are split, so the text is the same
// as drawing the bytes one at a time, which made pushing a benchmark's
// images take longer than pulling them.
type wordReader struct {
	r       *bufio.Reader
	pending []byte
}

func (w *wordReader) Read(p []byte) (int, error) {
	for len(w.pending) < len(p) {
		b, err := w.r.ReadByte()
		if err != nil {
			return 0, err
		}
		sep := byte(' ')
		if b%8 == 0 {
			sep = '\n'
		}
		w.pending = append(w.pending, vocabulary[int(b)%len(vocabulary)]...)
		w.pending = append(w.pending, sep)
	}
	n := copy(p, w.pending)
	w.pending = w.pending[n:]
	return n, nil
}

// Push writes img to repo:tag on r and fails the test on error. The push
// goes through the recorder like any client; call Reset afterwards to keep
// it out of assertions. Call only from the test goroutine.
func (r *Registry) Push(t testing.TB, repo, tag string, img Image) Pushed {
	t.Helper()
	p, err := r.PushContext(t.Context(), repo, tag, img)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// PushContext is Push for programs outside tests.
func (r *Registry) PushContext(ctx context.Context, repo, tag string, img Image) (Pushed, error) {
	ref := r.Host() + "/" + repo + ":" + tag
	p, err := push(ctx, ref, img)
	if err != nil {
		return Pushed{}, fmt.Errorf("registry %s: push %s: %w", r.name, ref, err)
	}
	return p, nil
}

// PushImage writes a built image, such as a corpus image
// (integration/corpus), to repo:tag on r.
func (r *Registry) PushImage(ctx context.Context, repo, tag string, image v1.Image) (Pushed, error) {
	ref := r.Host() + "/" + repo + ":" + tag
	p, err := writeImage(ctx, ref, image)
	if err != nil {
		return Pushed{}, fmt.Errorf("registry %s: push %s: %w", r.name, ref, err)
	}
	return p, nil
}

func push(ctx context.Context, ref string, img Image) (Pushed, error) {
	image, err := BuildImage(img)
	if err != nil {
		return Pushed{}, err
	}
	return writeImage(ctx, ref, image)
}

func writeImage(ctx context.Context, ref string, image v1.Image) (Pushed, error) {
	tag, err := name.NewTag(ref, name.Insecure)
	if err != nil {
		return Pushed{}, fmt.Errorf("parse reference: %w", err)
	}
	if err := remote.Write(tag, image, remote.WithContext(ctx)); err != nil {
		return Pushed{}, fmt.Errorf("write image: %w", err)
	}
	return describe(ref, image)
}

func describe(ref string, image v1.Image) (Pushed, error) {
	m, err := image.Manifest()
	if err != nil {
		return Pushed{}, fmt.Errorf("read manifest: %w", err)
	}
	d, err := image.Digest()
	if err != nil {
		return Pushed{}, fmt.Errorf("compute manifest digest: %w", err)
	}
	p := Pushed{Ref: ref, Digest: digest.Digest(d.String()), Config: digest.Digest(m.Config.Digest.String()), ConfigSize: m.Config.Size}
	for _, l := range m.Layers {
		p.Layers = append(p.Layers, digest.Digest(l.Digest.String()))
		p.LayerSizes = append(p.LayerSizes, l.Size)
	}
	return p, nil
}
