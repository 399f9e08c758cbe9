package registry

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io/fs"
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

// Dir is the mode and owner of a directory entry in a FileLayers layer
// (Image.FileLayerDirs). The zero Dir is the entry written for a parent
// directory: mode 0755, owned by root.
type Dir struct {
	// Mode holds permission bits only (fs.ModePerm); 0 means 0755.
	Mode fs.FileMode
	// UID and GID are the numeric owner, as image layers record it.
	UID, GID int
}

// buildChangesLayer makes one layer of Image.FileLayers, where nil content
// deletes a path, or makes a directory opaque when the path ends in "/".
// dirs are directory entries with their mode and owner; with impliedDirs
// no other directory entry is written.
func buildChangesLayer(changes map[string][]byte, dirs map[string]Dir, impliedDirs bool) (v1.Layer, error) {
	l := newFilesLayer()
	l.impliedDirs = impliedDirs
	for p, d := range dirs {
		if err := l.dir(p, d); err != nil {
			return nil, err
		}
	}
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
	dirs    map[string]Dir   // directory entries given with their mode and owner
	// impliedDirs writes no directory entries but dirs: parents are left
	// for the unpacker to create, or to keep from the layers below.
	impliedDirs bool
}

type entry struct {
	mode    int64
	content []byte
}

func newFilesLayer() *filesLayer {
	return &filesLayer{seen: map[string]bool{}, files: map[string]entry{}, deleted: map[string]bool{}, dirs: map[string]Dir{}}
}

// cleanName turns a path as given (absolute or relative to /) into its tar
// name, without a trailing slash.
func cleanName(p string) (string, error) {
	name := strings.TrimPrefix(path.Clean("/"+p), "/")
	if name == "" {
		return "", fmt.Errorf("path %q names the root", p)
	}
	if strings.HasPrefix(path.Base(name), whiteoutPrefix) {
		// Such an entry would be read back as a whiteout of another path.
		return "", fmt.Errorf("path %q has the whiteout prefix %q", p, whiteoutPrefix)
	}
	return name, nil
}

// name is cleanName for a path of the changes, each of which may be given
// once.
func (l *filesLayer) name(p string) (string, error) {
	name, err := cleanName(p)
	if err != nil {
		return "", err
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

// dir adds a directory entry with d's mode and owner. It is kept apart from
// the changes' paths, so that a directory can be given both its mode here
// and made opaque there; build rejects one that is a file or deleted.
func (l *filesLayer) dir(p string, d Dir) error {
	name, err := cleanName(p)
	if err != nil {
		return err
	}
	if _, ok := l.dirs[name]; ok {
		return fmt.Errorf("directory %q given twice", p)
	}
	if d.Mode&^fs.ModePerm != 0 {
		return fmt.Errorf("directory %q: mode %v has bits beyond the permissions", p, d.Mode)
	}
	if d.UID < 0 || d.GID < 0 {
		return fmt.Errorf("directory %q: owner %d:%d is negative", p, d.UID, d.GID)
	}
	if d.Mode == 0 {
		d.Mode = 0o755
	}
	l.dirs[name] = d
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

// build writes the entries and their directories as a gzip tar in sorted
// order, so the blob depends only on what was added, not on map order or
// the clock. Parent directories get the zero Dir unless given, and are left
// out with impliedDirs.
func (l *filesLayer) build() (v1.Layer, error) {
	parents := map[string]bool{}
	for name := range l.files {
		addParents(parents, name)
	}
	for name := range l.dirs {
		addParents(parents, name)
	}
	dirs := map[string]Dir{}
	for name := range parents {
		// Checked also when not written: the layer would still be wrong.
		if _, ok := l.files[name]; ok {
			return nil, fmt.Errorf("%q is both a file and a parent directory", name)
		}
		if l.deleted[name] {
			return nil, fmt.Errorf("%q is both deleted and a parent directory", name)
		}
		if !l.impliedDirs {
			dirs[name] = Dir{Mode: 0o755}
		}
	}
	for name, d := range l.dirs {
		if _, ok := l.files[name]; ok {
			return nil, fmt.Errorf("%q is both a file and a directory", name)
		}
		if l.deleted[name] {
			return nil, fmt.Errorf("%q is both deleted and a directory", name)
		}
		dirs[name] = d
	}
	names := make([]string, 0, len(dirs)+len(l.files))
	for name := range dirs {
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
		d := dirs[name]
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(d.Mode), Uid: d.UID, Gid: d.GID, ModTime: epoch, Format: tar.FormatUSTAR}
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

// addParents adds to parents every directory above name.
func addParents(parents map[string]bool, name string) {
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		parents[dir] = true
	}
}
