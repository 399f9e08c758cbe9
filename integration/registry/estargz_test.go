package registry

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/opencontainers/go-digest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBuildEStargzImage checks what a lazy-pulling snapshotter relies on:
// each layer is eStargz whose TOC matches its annotation, holds the same
// file as the plain image, and its diff ID is in the config.
func TestBuildEStargzImage(t *testing.T) {
	img := Image{Layers: []int64{1000, 70000}, Seed: 7}
	built, err := BuildEStargzImage(img)
	require.NoError(t, err)
	again, err := BuildEStargzImage(img)
	require.NoError(t, err)
	d1, err := built.Digest()
	require.NoError(t, err)
	d2, err := again.Digest()
	require.NoError(t, err)
	assert.Equal(t, d1, d2, "eStargz images are deterministic")

	m, err := built.Manifest()
	require.NoError(t, err)
	cfg, err := built.ConfigFile()
	require.NoError(t, err)
	layers, err := built.Layers()
	require.NoError(t, err)
	require.Len(t, m.Layers, len(img.Layers))
	require.Len(t, cfg.RootFS.DiffIDs, len(img.Layers))
	require.Len(t, cfg.History, len(img.Layers))
	for i, l := range layers {
		rc, err := l.Compressed()
		require.NoError(t, err)
		blob, err := io.ReadAll(rc)
		require.NoError(t, err)
		r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(blob), 0, int64(len(blob))))
		require.NoError(t, err, "layer %d", i)
		toc := m.Layers[i].Annotations[estargz.TOCJSONDigestAnnotation]
		_, err = r.VerifyTOC(digest.Digest(toc))
		require.NoError(t, err, "layer %d: TOC digest annotation", i)
		assert.NotEmpty(t, m.Layers[i].Annotations[estargz.StoreUncompressedSizeAnnotation])
		e, ok := r.Lookup(layerName(i))
		require.True(t, ok, "layer %d holds %s", i, layerName(i))
		assert.Equal(t, img.Layers[i], e.Size)

		diffID, err := l.DiffID()
		require.NoError(t, err)
		assert.Equal(t, cfg.RootFS.DiffIDs[i], diffID)
		u, err := l.Uncompressed()
		require.NoError(t, err)
		sum, err := digest.FromReader(u)
		require.NoError(t, err)
		assert.Equal(t, diffID.String(), sum.String(), "layer %d: diff ID is the uncompressed digest", i)
	}
}

func layerName(i int) string { return fmt.Sprintf("layer-%d.bin", i) }
