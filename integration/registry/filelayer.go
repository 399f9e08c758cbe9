package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"path"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Whiteout names from the OCI image layer spec (layer.md, "Whiteouts").
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = whiteoutPrefix + whiteoutPrefix + ".opq"
)

// buildFilesLayer makes the layer of Image.Files: every path a regular
// file, nil content an empty one.
func buildFilesLayer(files map[string][]byte) (v1.Layer, error) {
	l := newFilesLayer()
	for p, content := range files {
		if err := l.file(p, content); err != nil {
			return nil, err
		}
	}
	return l.build()
}

// buildChangesLayer makes one layer of Image.FileLayers, where nil content
// deletes a path, or makes a directory opaque when the path ends in "/".
func buildChangesLayer(changes map[string][]byte) (v1.Layer, error) {
	l := newFilesLayer()
	for p, content := range changes {
		var err error
		switch {
		case content != nil:
			err = l.file(p, content)
		case strings.HasSuffix(p, "/"):
			err = l.opaque(p)
		default:
			err = l.whiteout(p)
		}
		if err != nil {
			return nil, err
		}
	}
	return l.build()
}

// filesLayer gathers the entries of one layer before it is written, so
// that the tar can list them in sorted order whatever the map order was.
type filesLayer struct {
	seen    map[string]bool  // cleaned paths as given, to catch one given twice
	files   map[string]entry // by tar name: files, whiteouts and opaque markers
	deleted map[string]bool  // paths a whiteout deletes
}

type entry struct {
	mode    int64
	content []byte
}

func newFilesLayer() *filesLayer {
	return &filesLayer{seen: map[string]bool{}, files: map[string]entry{}, deleted: map[string]bool{}}
}

// name turns a path as given (absolute or relative to /) into its tar name.
func (l *filesLayer) name(p string) (string, error) {
	name := strings.TrimPrefix(path.Clean("/"+p), "/")
	if name == "" {
		return "", fmt.Errorf("file path %q names the root", p)
	}
	if strings.HasPrefix(path.Base(name), whiteoutPrefix) {
		// Such a file would be read back as a whiteout of another path.
		return "", fmt.Errorf("file path %q has the whiteout prefix %q", p, whiteoutPrefix)
	}
	if l.seen[name] {
		return "", fmt.Errorf("file path %q given twice", p)
	}
	l.seen[name] = true
	return name, nil
}

func (l *filesLayer) file(p string, content []byte) error {
	if strings.HasSuffix(p, "/") {
		return fmt.Errorf("file path %q names a directory", p)
	}
	name, err := l.name(p)
	if err != nil {
		return err
	}
	// 0755, so that an image can carry an executable.
	l.files[name] = entry{mode: 0o755, content: content}
	return nil
}

func (l *filesLayer) whiteout(p string) error {
	name, err := l.name(p)
	if err != nil {
		return err
	}
	l.deleted[name] = true
	l.files[path.Join(path.Dir(name), whiteoutPrefix+path.Base(name))] = entry{mode: 0o644}
	return nil
}

func (l *filesLayer) opaque(p string) error {
	name, err := l.name(p)
	if err != nil {
		return err
	}
	l.files[path.Join(name, opaqueMarker)] = entry{mode: 0o644}
	return nil
}

// build writes the entries and their parent directories as a gzip tar in
// sorted order, so the blob depends only on what was added, not on map
// order or the clock.
func (l *filesLayer) build() (v1.Layer, error) {
	dirs := map[string]bool{}
	for name := range l.files {
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			dirs[dir] = true
		}
	}
	names := make([]string, 0, len(dirs)+len(l.files))
	for name := range dirs {
		if _, ok := l.files[name]; ok {
			return nil, fmt.Errorf("%q is both a file and a parent directory", name)
		}
		if l.deleted[name] {
			return nil, fmt.Errorf("%q is both deleted and a parent directory", name)
		}
		names = append(names, name)
	}
	for name := range l.files {
		names = append(names, name)
	}
	sort.Strings(names)

	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.NoCompression)
	if err != nil {
		return nil, fmt.Errorf("create gzip writer: %w", err)
	}
	tw := tar.NewWriter(zw)
	for _, name := range names {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, ModTime: epoch, Format: tar.FormatUSTAR}
		e, isFile := l.files[name]
		if isFile {
			hdr.Typeflag, hdr.Name, hdr.Mode, hdr.Size = tar.TypeReg, name, e.mode, int64(len(e.content))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write tar header for %s: %w", name, err)
		}
		if _, err := tw.Write(e.content); err != nil {
			return nil, fmt.Errorf("write %s: %w", name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close tar: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("close gzip: %w", err)
	}
	return gzipLayer(buf.Bytes())
}
