package registry

import (
	"archive/tar"
	"io"
	"io/fs"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tarEntry is what an unpacker reads from one tar header and its body.
type tarEntry struct {
	name    string
	typ     byte
	mode    int64
	content string
	uid     int
	gid     int
}

// tarEntries reads a layer's uncompressed tar in order.
func tarEntries(t *testing.T, l v1.Layer) []tarEntry {
	t.Helper()
	rc, err := l.Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	var out []tarEntry
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		assert.Zero(t, hdr.ModTime.Unix(), "%s has a fixed mtime", hdr.Name)
		out = append(out, tarEntry{hdr.Name, hdr.Typeflag, hdr.Mode, string(b), hdr.Uid, hdr.Gid})
	}
}

func dir(name string) tarEntry { return ownedDir(name, 0o755, 0, 0) }

func ownedDir(name string, mode int64, uid, gid int) tarEntry {
	return tarEntry{name, tar.TypeDir, mode, "", uid, gid}
}

func file(name, content string) tarEntry { return tarEntry{name, tar.TypeReg, 0o755, content, 0, 0} }

func marker(name string) tarEntry { return tarEntry{name, tar.TypeReg, 0o644, "", 0, 0} }

func TestFileLayersTarEntries(t *testing.T) {
	private := Dir{Mode: 0o700, UID: 1000, GID: 1000}
	for _, tc := range []struct {
		name    string
		changes map[string][]byte
		dirs    map[string]Dir // FileLayerDirs of the layer
		implied bool           // ImpliedDirs
		want    []tarEntry
	}{{
		name:    "files with their parents",
		changes: map[string][]byte{"/a/x": []byte("x"), "a/y": []byte("y"), "/keep": []byte("k")},
		want:    []tarEntry{dir("a/"), file("a/x", "x"), file("a/y", "y"), file("keep", "k")},
	}, {
		// nil means delete in FileLayers, so an empty file needs []byte{}.
		name:    "empty file",
		changes: map[string][]byte{"/empty": {}},
		want:    []tarEntry{file("empty", "")},
	}, {
		name:    "whiteout of a file",
		changes: map[string][]byte{"/a/x": nil},
		want:    []tarEntry{dir("a/"), marker("a/.wh.x")},
	}, {
		name:    "whiteout at the top",
		changes: map[string][]byte{"/keep": nil},
		want:    []tarEntry{marker(".wh.keep")},
	}, {
		name:    "whiteout of a directory",
		changes: map[string][]byte{"/a/b": nil},
		want:    []tarEntry{dir("a/"), marker("a/.wh.b")},
	}, {
		name:    "opaque directory with a new file",
		changes: map[string][]byte{"/b/": nil, "/b/new": []byte("n")},
		want:    []tarEntry{dir("b/"), marker("b/.wh..wh..opq"), file("b/new", "n")},
	}, {
		name:    "opaque nested directory alone",
		changes: map[string][]byte{"b/c/": nil},
		want:    []tarEntry{dir("b/"), dir("b/c/"), marker("b/c/.wh..wh..opq")},
	}, {
		name:    "additions and a deletion",
		changes: map[string][]byte{"/a/x2": []byte("x2"), "/keep": nil},
		want:    []tarEntry{marker(".wh.keep"), dir("a/"), file("a/x2", "x2")},
	}, {
		name:    "directory with its mode and owner",
		changes: map[string][]byte{"/d/f": []byte("f")},
		dirs:    map[string]Dir{"d": private},
		want:    []tarEntry{ownedDir("d/", 0o700, 1000, 1000), file("d/f", "f")},
	}, {
		name: "directory alone, with a trailing slash",
		dirs: map[string]Dir{"/e/": {Mode: 0o750, UID: 1001, GID: 1001}},
		want: []tarEntry{ownedDir("e/", 0o750, 1001, 1001)},
	}, {
		name: "nested directory gets its parents",
		dirs: map[string]Dir{"/a/b": private},
		want: []tarEntry{dir("a/"), ownedDir("a/b/", 0o700, 1000, 1000)},
	}, {
		// So that listing a directory only to keep it with ImpliedDirs
		// writes what a parent would get.
		name:    "zero Dir is the parent entry",
		changes: map[string][]byte{"/a/x": []byte("x")},
		dirs:    map[string]Dir{"a": {}},
		want:    []tarEntry{dir("a/"), file("a/x", "x")},
	}, {
		name:    "opaque directory with its mode and owner",
		changes: map[string][]byte{"/b/": nil},
		dirs:    map[string]Dir{"b": private},
		want:    []tarEntry{ownedDir("b/", 0o700, 1000, 1000), marker("b/.wh..wh..opq")},
	}, {
		name:    "implied parents of a file and a whiteout",
		changes: map[string][]byte{"/d/g": []byte("g"), "/e/f": nil},
		implied: true,
		want:    []tarEntry{file("d/g", "g"), marker("e/.wh.f")},
	}, {
		name:    "implied parents of an opaque directory",
		changes: map[string][]byte{"/a/b/": nil},
		implied: true,
		want:    []tarEntry{marker("a/b/.wh..wh..opq")},
	}, {
		name:    "implied parents, listed directories kept",
		changes: map[string][]byte{"/d/f": []byte("f"), "/d/h/i": []byte("i"), "/e/f": []byte("f")},
		dirs:    map[string]Dir{"d": private, "d/h": {}},
		implied: true,
		want:    []tarEntry{ownedDir("d/", 0o700, 1000, 1000), file("d/f", "f"), dir("d/h/"), file("d/h/i", "i"), file("e/f", "f")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := BuildImage(Image{
				FileLayers:    []map[string][]byte{tc.changes},
				FileLayerDirs: []map[string]Dir{tc.dirs},
				ImpliedDirs:   tc.implied,
			})
			require.NoError(t, err)
			layers, err := img.Layers()
			require.NoError(t, err)
			require.Len(t, layers, 1)
			assert.Equal(t, tc.want, tarEntries(t, layers[0]))
		})
	}
}

// TestFilesDigestsArePinned pins the digests of images pushed by other
// tests, so that a change to the tar writer shows here first, not as a
// pull of different bytes.
func TestFilesDigestsArePinned(t *testing.T) {
	amd64 := ocispec.Platform{OS: "linux", Architecture: "amd64"}
	for name, tc := range map[string]struct {
		img  Image
		want string
	}{
		"Files": {
			img:  Image{Platform: amd64, Files: map[string][]byte{"/pause": []byte("#!/bin/sh\n"), "usr/bin/tool": []byte("tool"), "/usr/lib/x": nil}},
			want: "sha256:c204f09f83a036862db110e9c2a5a3df7f2d60b359fbce08ff220ec80fc76252",
		},
		"FileLayers (TestParallelUnpackWhiteouts)": {
			img: Image{Platform: amd64, FileLayers: []map[string][]byte{
				{"/a/x": []byte("x1"), "/a/y": []byte("y1"), "/b/z": []byte("z1"), "/keep": []byte("keep1")},
				{"/a/x": nil},
				{"/b/": nil, "/b/new": []byte("new3")},
				{"/a/x2": []byte("x4"), "/keep": nil},
			}},
			want: "sha256:f4ce65c4ed9fe10f0a65cd6fc20818c1be42ba42aa54744ceaa2e88a42a095b5",
		},
	} {
		assert.Equal(t, tc.want, digestOf(t, tc.img), name)
	}
}

func TestFileLayersOrderAndDigests(t *testing.T) {
	img := Image{
		Layers:     []int64{10},
		Files:      map[string][]byte{"/f": []byte("f")},
		FileLayers: []map[string][]byte{{"/a/x": []byte("x")}, {"/a/x": nil}},
	}
	built, err := BuildImage(img)
	require.NoError(t, err)
	layers, err := built.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 4, "one layer per size, one for Files, one per FileLayers map")
	assert.Equal(t, []tarEntry{file("f", "f")}, tarEntries(t, layers[1]))
	assert.Equal(t, []tarEntry{dir("a/"), file("a/x", "x")}, tarEntries(t, layers[2]))
	assert.Equal(t, []tarEntry{dir("a/"), marker("a/.wh.x")}, tarEntries(t, layers[3]))

	d := digestOf(t, img)
	for range 5 {
		assert.Equal(t, d, digestOf(t, img), "map order does not leak into digests")
	}
	swapped := img
	swapped.FileLayers = []map[string][]byte{img.FileLayers[1], img.FileLayers[0]}
	assert.NotEqual(t, d, digestOf(t, swapped), "layer order matters")
	empty := img
	empty.FileLayers = []map[string][]byte{img.FileLayers[0], {"/a/x": {}}}
	assert.NotEqual(t, d, digestOf(t, empty), "an empty file is no deletion")
	implied := img
	implied.ImpliedDirs = true
	assert.NotEqual(t, d, digestOf(t, implied), "implied directories are not written")
	owned := img
	owned.FileLayerDirs = []map[string]Dir{{"a": {UID: 1}}}
	assert.NotEqual(t, d, digestOf(t, owned), "a directory's owner is written")
}

func TestFileLayersRejectBadChanges(t *testing.T) {
	for name, changes := range map[string]map[string][]byte{
		"delete the root":          {"/": nil},
		"same path twice":          {"/a": nil, "a": []byte("x")},
		"opaque and deleted":       {"/a/": nil, "/a": nil},
		"deleted is a parent":      {"/a": nil, "/a/b": []byte("x")},
		"file is a parent":         {"/a": []byte("x"), "/a/b": []byte("y")},
		"content on a directory":   {"/a/": []byte("x")},
		"whiteout name as a file":  {"/a/.wh.x": []byte("x")},
		"whiteout name as deleted": {"/.wh..wh..opq": nil},
	} {
		_, err := BuildImage(Image{FileLayers: []map[string][]byte{changes}})
		assert.Error(t, err, name)
	}
}

func TestFileLayerDirsRejectBadDirs(t *testing.T) {
	layer := func(changes map[string][]byte, dirs map[string]Dir) Image {
		return Image{FileLayers: []map[string][]byte{changes}, FileLayerDirs: []map[string]Dir{dirs}}
	}
	x := []byte("x")
	for name, img := range map[string]Image{
		"more dirs than layers":     {FileLayers: []map[string][]byte{{"/a": x}}, FileLayerDirs: []map[string]Dir{nil, nil}},
		"implied without layers":    {Files: map[string][]byte{"/a/b": x}, ImpliedDirs: true},
		"the root":                  layer(nil, map[string]Dir{"/": {}}),
		"same directory twice":      layer(nil, map[string]Dir{"/a": {}, "a/": {}}),
		"whiteout name":             layer(nil, map[string]Dir{"/a/.wh.b": {}}),
		"directory is a file":       layer(map[string][]byte{"/a": x}, map[string]Dir{"a": {}}),
		"directory is deleted":      layer(map[string][]byte{"/a": nil}, map[string]Dir{"a/": {}}),
		"parent is a file":          layer(map[string][]byte{"/a": x}, map[string]Dir{"a/b": {}}),
		"mode beyond permissions":   layer(nil, map[string]Dir{"a": {Mode: fs.ModeDir | 0o755}}),
		"negative owner":            layer(nil, map[string]Dir{"a": {UID: -1}}),
		"implied, deleted a parent": {FileLayers: []map[string][]byte{{"/a": nil, "/a/b": x}}, ImpliedDirs: true},
	} {
		_, err := BuildImage(img)
		assert.Error(t, err, name)
	}
}
