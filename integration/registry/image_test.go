package registry

import (
	"archive/tar"
	"fmt"
	"io"
	"runtime"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func digestOf(t *testing.T, img Image) string {
	t.Helper()
	built, err := BuildImage(img)
	require.NoError(t, err)
	d, err := built.Digest()
	require.NoError(t, err)
	return d.String()
}

func TestBuildImageIsDeterministic(t *testing.T) {
	amd64 := ocispec.Platform{OS: "linux", Architecture: "amd64"}
	base := Image{Layers: []int64{1000, 0, 70000}, Seed: 7, Platform: amd64}

	// Pinned so that a change in content generation, which would silently
	// invalidate digests other tests rely on, fails here first.
	const golden = "sha256:4eb05a8b7aea122b448a214a373ffe51fac51ea0fbfa5fee6f18259313bda80c"
	assert.Equal(t, golden, digestOf(t, base))
	assert.Equal(t, digestOf(t, base), digestOf(t, base))

	variants := map[string]Image{
		"seed":       {Layers: base.Layers, Seed: 8, Platform: amd64},
		"layer size": {Layers: []int64{1001, 0, 70000}, Seed: 7, Platform: amd64},
		"platform":   {Layers: base.Layers, Seed: 7, Platform: ocispec.Platform{OS: "linux", Architecture: "arm64"}},
	}
	for name, img := range variants {
		assert.NotEqual(t, golden, digestOf(t, img), "changing %s changes the digest", name)
	}
}

func TestBuildImageContent(t *testing.T) {
	sizes := []int64{5000, 0}
	img, err := BuildImage(Image{Layers: sizes, Seed: 1})
	require.NoError(t, err)

	mt, err := img.MediaType()
	require.NoError(t, err)
	assert.Equal(t, types.OCIManifestSchema1, mt)
	cfg, err := img.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, "linux", cfg.OS)
	assert.Equal(t, runtime.GOARCH, cfg.Architecture)
	assert.Len(t, cfg.RootFS.DiffIDs, len(sizes))

	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, len(sizes))
	for i, l := range layers {
		lmt, err := l.MediaType()
		require.NoError(t, err)
		assert.Equal(t, types.OCILayer, lmt)

		compressed, err := l.Size()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, compressed, sizes[i], "random content does not shrink")

		rc, err := l.Uncompressed()
		require.NoError(t, err)
		tr := tar.NewReader(rc)
		hdr, err := tr.Next()
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("layer-%d.bin", i), hdr.Name)
		assert.EqualValues(t, 0o644, hdr.Mode)
		assert.Equal(t, byte(tar.TypeReg), hdr.Typeflag)
		assert.Zero(t, hdr.ModTime.Unix())
		n, err := io.Copy(io.Discard, tr)
		require.NoError(t, err)
		assert.Equal(t, sizes[i], n)
		_, err = tr.Next()
		assert.ErrorIs(t, err, io.EOF, "exactly one file per layer")
		require.NoError(t, rc.Close())
	}
}

func TestCompressibleLayersShrink(t *testing.T) {
	const size = 1 << 20
	img, err := BuildImage(Image{Layers: []int64{size}, Seed: 1, Compressible: true})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	n, err := layers[0].Size()
	if err != nil {
		t.Fatal(err)
	}
	if n > size/2 || n < size/10 {
		t.Fatalf("compressible 1 MiB layer is %d bytes on the wire, want between a tenth and a half", n)
	}
}

func TestBuildImageFilesAndEntrypoint(t *testing.T) {
	files := map[string][]byte{"/pause": []byte("#!/bin/sh\n"), "usr/bin/tool": []byte("tool"), "/usr/lib/x": nil}
	img := Image{Layers: []int64{100}, Seed: 3, Files: files, Entrypoint: []string{"/pause"}, Cmd: []string{"-v"}}
	built, err := BuildImage(img)
	require.NoError(t, err)

	cfg, err := built.ConfigFile()
	require.NoError(t, err)
	assert.Equal(t, []string{"/pause"}, cfg.Config.Entrypoint)
	assert.Equal(t, []string{"-v"}, cfg.Config.Cmd)
	assert.Len(t, cfg.RootFS.DiffIDs, 2, "the files come in one more layer")

	layers, err := built.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 2)
	lmt, err := layers[1].MediaType()
	require.NoError(t, err)
	assert.Equal(t, types.OCILayer, lmt)
	rc, err := layers[1].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	type entry struct {
		typ     byte
		mode    int64
		content string
	}
	got := map[string]entry{}
	var order []string
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		assert.Zero(t, hdr.ModTime.Unix())
		got[hdr.Name] = entry{hdr.Typeflag, hdr.Mode, string(b)}
		order = append(order, hdr.Name)
	}
	assert.Equal(t, map[string]entry{
		"pause":        {tar.TypeReg, 0o755, "#!/bin/sh\n"},
		"usr/":         {tar.TypeDir, 0o755, ""},
		"usr/bin/":     {tar.TypeDir, 0o755, ""},
		"usr/bin/tool": {tar.TypeReg, 0o755, "tool"},
		"usr/lib/":     {tar.TypeDir, 0o755, ""},
		"usr/lib/x":    {tar.TypeReg, 0o755, ""},
	}, got)
	assert.Equal(t, []string{"pause", "usr/", "usr/bin/", "usr/bin/tool", "usr/lib/", "usr/lib/x"}, order,
		"directories come before their files")

	// Map order does not leak into digests; content, entrypoint and cmd do.
	d := digestOf(t, img)
	for range 5 {
		assert.Equal(t, d, digestOf(t, img))
	}
	variants := map[string]Image{
		"content":    {Layers: img.Layers, Seed: 3, Files: map[string][]byte{"/pause": []byte("other")}, Entrypoint: img.Entrypoint, Cmd: img.Cmd},
		"entrypoint": {Layers: img.Layers, Seed: 3, Files: files, Entrypoint: []string{"/usr/bin/tool"}, Cmd: img.Cmd},
		"cmd":        {Layers: img.Layers, Seed: 3, Files: files, Entrypoint: img.Entrypoint},
		"no files":   {Layers: img.Layers, Seed: 3, Entrypoint: img.Entrypoint, Cmd: img.Cmd},
	}
	for name, v := range variants {
		assert.NotEqual(t, d, digestOf(t, v), "changing %s changes the digest", name)
	}
}

func TestBuildImageRejectsBadFiles(t *testing.T) {
	for name, files := range map[string]map[string][]byte{
		"root":             {"/": []byte("x")},
		"same path twice":  {"/a": nil, "a": nil},
		"file is a parent": {"/a": nil, "/a/b": nil},
		"directory path":   {"/a/": []byte("x")},
		"whiteout name":    {"/a/.wh.b": nil},
	} {
		_, err := BuildImage(Image{Files: files})
		assert.Error(t, err, name)
	}
}
