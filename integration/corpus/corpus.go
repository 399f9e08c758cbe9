// Package corpus builds real-shaped images for benchmarks from file trees
// already on the machine: the Go toolchain, shared libraries, binaries,
// documentation. Their bytes are what node images carry (binaries and
// libraries that compress two or three times, many small files), and
// images share base layers the way real ones do.
//
// A layer is deterministic: its entries sorted, owned by root, dated at one
// fixed time, and gzipped by the Go standard library (or compressed as its
// image asks: gzip at another level, or zstd). It is cached as a file
// under a directory, so the corpus is built once per machine and its
// digests stay the same between runs.
package corpus

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// Source is part of a layer: files of a tree on this machine, taken in
// sorted walk order.
type Source struct {
	// Dir is the tree's root on this machine.
	Dir string
	// Into is where the tree goes in the layer, such as "usr/lib".
	Into string
	// Skip passes over this many bytes of files first, so that layers
	// from one tree hold different files; Budget then takes files until
	// that many bytes (0: the rest of the tree).
	Skip, Budget int64
}

// Layer is one layer, made of its sources in order.
type Layer []Source

// Compression is how a layer's tar is compressed.
type Compression string

const (
	// Gzip is gzip at its default level, as most images are: the zero
	// value, so layers that do not say are as they always were.
	Gzip Compression = ""
	// GzipFast and GzipBest are gzip at level 1 and at level 9.
	GzipFast Compression = "gzip-1"
	GzipBest Compression = "gzip-9"
	// Zstd is zstd at its default level, with the zstd layer media type.
	Zstd Compression = "zstd"
)

// MediaType is the layer media type of c.
func (c Compression) MediaType() types.MediaType {
	if c == Zstd {
		return types.OCILayerZStd
	}
	return types.OCILayer
}

// Image is an image's layers, base layers first.
type Image struct {
	Name   string
	Layers []Layer
	// Compression is each layer's, by index; a layer past its end is
	// Gzip.
	Compression []Compression
}

// compressionOf is the compression of img's layer i.
func (img Image) compressionOf(i int) Compression {
	if i < len(img.Compression) {
		return img.Compression[i]
	}
	return Gzip
}

// epoch dates every entry, as reproducible builds do.
var epoch = time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)

// Build returns img as an OCI image for the machine's platform, its
// layers from cacheDir where built before.
func Build(cacheDir string, img Image) (v1.Image, error) {
	var layers []v1.Layer
	for i, l := range img.Layers {
		c := img.compressionOf(i)
		file, err := cached(cacheDir, l, c)
		if err != nil {
			return nil, fmt.Errorf("%s layer %d: %w", img.Name, i, err)
		}
		// The file is compressed already: LayerFromFile sees which way
		// from its first bytes and takes it as it is; the options give
		// the media type (and keep it from warning of a mismatch).
		opts := []tarball.LayerOption{tarball.WithMediaType(c.MediaType())}
		if c == Zstd {
			opts = append(opts, tarball.WithCompression(compression.ZStd))
		}
		layer, err := tarball.LayerFromFile(file, opts...)
		if err != nil {
			return nil, fmt.Errorf("%s layer %d: %w", img.Name, i, err)
		}
		layers = append(layers, layer)
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	out, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", img.Name, err)
	}
	cfg, err := out.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", img.Name, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = runtime.GOOS, runtime.GOARCH
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = []string{"/pause"}
	return mutate.ConfigFile(out, cfg)
}

// cached returns the file of l's tar compressed as c, building it first
// when cacheDir does not hold it. The name is a hash of l's description
// and c: the same sources compressed the same way give the same file.
// (Gzip adds nothing to the description, so the files built before there
// was a choice are still found.)
func cached(cacheDir string, l Layer, c Compression) (string, error) {
	desc, err := json.Marshal(l)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(append(append(desc, runtime.Version()...), c...))
	ext := ".tar.gz"
	if c == Zstd {
		ext = ".tar.zst"
	}
	file := filepath.Join(cacheDir, hex.EncodeToString(sum[:12])+ext)
	if _, err := os.Stat(file); err == nil {
		return file, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(cacheDir, ".layer-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp, l, c); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	return file, os.Rename(tmp.Name(), file)
}

// write writes l as a tar compressed as c to w.
func write(w io.Writer, l Layer, c Compression) error {
	zw, err := compressor(w, c)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	dirs := map[string]bool{}
	for _, s := range l {
		if err := add(tw, s, dirs); err != nil {
			return fmt.Errorf("%s: %w", s.Dir, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// compressor compresses to w as c.
func compressor(w io.Writer, c Compression) (io.WriteCloser, error) {
	switch c {
	case Gzip:
		return gzip.NewWriter(w), nil
	case GzipFast:
		return gzip.NewWriterLevel(w, gzip.BestSpeed)
	case GzipBest:
		return gzip.NewWriterLevel(w, gzip.BestCompression)
	case Zstd:
		// One goroutine: the same bytes every time, whatever the
		// machine's CPUs.
		return zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	}
	return nil, fmt.Errorf("unknown compression %q", c)
}

// add writes the files of s to tw, with every parent directory once.
func add(tw *tar.Writer, s Source, dirs map[string]bool) error {
	var seen, taken int64
	full := func() bool { return s.Budget > 0 && taken >= s.Budget }
	return filepath.WalkDir(s.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			// An unreadable part of a system tree is left out.
			if d != nil && d.IsDir() && p != s.Dir {
				return fs.SkipDir
			}
			return nil
		}
		if full() {
			return fs.SkipAll
		}
		rel, err := filepath.Rel(s.Dir, p)
		if err != nil || rel == "." {
			return err
		}
		name := path.Join(s.Into, filepath.ToSlash(rel))
		info, err := d.Info()
		if err != nil {
			return nil
		}
		hdr := &tar.Header{Name: name, ModTime: epoch, Mode: int64(info.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case d.IsDir():
			return nil // written as a parent of what it holds
		case info.Mode().IsRegular():
			seen += info.Size()
			if seen <= s.Skip {
				return nil
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil
			}
			if seen < s.Skip {
				return nil
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			return nil // devices, sockets, pipes: not in images
		}
		if err := parents(tw, name, dirs); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return nil
			}
			defer f.Close()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			// A file that changed size since the walk read it would make
			// the tar wrong: copy exactly the size written.
			if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			taken += hdr.Size
			return nil
		}
		return tw.WriteHeader(hdr)
	})
}

// parents writes the directory entries above name not written yet.
func parents(tw *tar.Writer, name string, dirs map[string]bool) error {
	dir := path.Dir(name)
	if dir == "." || dir == "/" || dirs[dir] {
		return nil
	}
	if err := parents(tw, dir, dirs); err != nil {
		return err
	}
	dirs[dir] = true
	return tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
}
