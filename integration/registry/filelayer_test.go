package registry

import (
	"archive/tar"
	"io"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tarEntry is what an unpacker reads from one tar header and its body.
type tarEntry struct {
	name    string
	typ     byte
	mode    int64
	content string
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
		out = append(out, tarEntry{hdr.Name, hdr.Typeflag, hdr.Mode, string(b)})
	}
}

func dir(name string) tarEntry { return tarEntry{name, tar.TypeDir, 0o755, ""} }

func file(name, content string) tarEntry { return tarEntry{name, tar.TypeReg, 0o755, content} }

func marker(name string) tarEntry { return tarEntry{name, tar.TypeReg, 0o644, ""} }

func TestFileLayersTarEntries(t *testing.T) {
	for _, tc := range []struct {
		name    string
		changes map[string][]byte
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
	}} {
		t.Run(tc.name, func(t *testing.T) {
			img, err := BuildImage(Image{FileLayers: []map[string][]byte{tc.changes}})
			require.NoError(t, err)
			layers, err := img.Layers()
			require.NoError(t, err)
			require.Len(t, layers, 1)
			assert.Equal(t, tc.want, tarEntries(t, layers[0]))
		})
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
