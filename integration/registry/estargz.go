package registry

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"strconv"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PushEStargz writes img to repo:tag on r as an eStargz image, for a lazy-
// pulling remote snapshotter (integration/stargz): the same files, config
// and history as Push, but each layer rebuilt by estargz.Build, with the
// TOC digest and uncompressed size annotations on its manifest descriptor,
// as stargz-snapshotter's converters write them. Pushed.Layers are the
// eStargz blobs. Call only from the test goroutine.
func (r *Registry) PushEStargz(t testing.TB, repo, tag string, img Image) Pushed {
	t.Helper()
	image, err := BuildEStargzImage(img)
	if err != nil {
		t.Fatalf("registry %s: build eStargz %s/%s:%s: %v", r.name, r.Host(), repo, tag, err)
	}
	p, err := r.PushImage(t.Context(), repo, tag, image)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BuildEStargzImage is BuildImage with every layer converted to eStargz.
func BuildEStargzImage(img Image) (v1.Image, error) {
	src, err := BuildImage(img)
	if err != nil {
		return nil, err
	}
	cfg, err := src.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	layers, err := src.Layers()
	if err != nil {
		return nil, fmt.Errorf("read layers: %w", err)
	}
	// The config again without its layers: Append adds the new diff IDs
	// and the history back, one per layer.
	history := cfg.History
	cfg = cfg.DeepCopy()
	cfg.RootFS.DiffIDs, cfg.History = nil, nil
	base, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, fmt.Errorf("set image config: %w", err)
	}
	base = mutate.MediaType(base, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)

	adds := make([]mutate.Addendum, 0, len(layers))
	for i, l := range layers {
		layer, annotations, err := toEStargz(l)
		if err != nil {
			return nil, fmt.Errorf("convert layer %d to eStargz: %w", i, err)
		}
		add := mutate.Addendum{Layer: layer, MediaType: types.OCILayer, Annotations: annotations}
		if i < len(history) {
			add.History = history[i]
		}
		adds = append(adds, add)
	}
	out, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, fmt.Errorf("append layers: %w", err)
	}
	return out, nil
}

// toEStargz rebuilds a layer as eStargz from its uncompressed tar and
// returns it with its descriptor annotations.
func toEStargz(l v1.Layer) (v1.Layer, map[string]string, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, nil, err
	}
	tarBytes, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("read tar: %w", err)
	}
	blob, err := estargz.Build(io.NewSectionReader(bytes.NewReader(tarBytes), 0, int64(len(tarBytes))))
	if err != nil {
		return nil, nil, err
	}
	defer blob.Close()
	data, err := io.ReadAll(blob)
	if err != nil {
		return nil, nil, fmt.Errorf("read eStargz blob: %w", err)
	}
	// DiffID and UncompressedSize are valid once the blob is read through
	// and closed.
	if err := blob.Close(); err != nil {
		return nil, nil, err
	}
	size, err := blob.UncompressedSize()
	if err != nil {
		return nil, nil, err
	}
	digest, _, err := v1.SHA256(bytes.NewReader(data))
	if err != nil {
		return nil, nil, err
	}
	diffID, err := v1.NewHash(blob.DiffID().String())
	if err != nil {
		return nil, nil, err
	}
	annotations := map[string]string{
		estargz.TOCJSONDigestAnnotation:         blob.TOCDigest().String(),
		estargz.StoreUncompressedSizeAnnotation: strconv.FormatInt(size, 10),
	}
	return &esgzLayer{data: data, digest: digest, diffID: diffID}, annotations, nil
}

// esgzLayer is an eStargz blob held in memory. Its diff ID is the digest of
// the whole decompressed stream, TOC entry and footer included, as
// estargz.Build computes it.
type esgzLayer struct {
	data           []byte
	digest, diffID v1.Hash
}

func (l *esgzLayer) Digest() (v1.Hash, error) { return l.digest, nil }
func (l *esgzLayer) DiffID() (v1.Hash, error) { return l.diffID, nil }
func (l *esgzLayer) Size() (int64, error)     { return int64(len(l.data)), nil }
func (l *esgzLayer) MediaType() (types.MediaType, error) {
	return types.OCILayer, nil
}

func (l *esgzLayer) Compressed() (io.ReadCloser, error) {
	return io.NopCloser(bytes.NewReader(l.data)), nil
}

func (l *esgzLayer) Uncompressed() (io.ReadCloser, error) {
	return gzip.NewReader(bytes.NewReader(l.data))
}
