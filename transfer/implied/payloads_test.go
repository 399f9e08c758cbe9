package implied

import (
	"archive/tar"
	"bytes"
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer/gunzip"
)

// payloadsSeenType is the media type of a stream processor that keeps
// the payloads it was opened with and passes the layer on as it is.
const payloadsSeenType = "application/vnd.pullwise.test.payloads-seen"

var seenPayloads = make(chan map[string]typeurl.Any, 1)

func init() {
	diff.RegisterProcessor(diff.StaticHandler(payloadsSeenType, func(_ context.Context, stream diff.StreamProcessor, payloads map[string]typeurl.Any) (diff.StreamProcessor, error) {
		seenPayloads <- payloads
		return passOn{stream}, nil
	}))
}

type passOn struct{ diff.StreamProcessor }

func (passOn) MediaType() string { return ocispec.MediaTypeImageLayer }

// TestLayerProcessorGetsApplyPayloads: a layer written into a new
// snapshot's upper directory (parallel unpack), which this package
// applies itself rather than containerd's applier, still hands the apply
// options' payloads to the layer's stream processor, so that a gzip
// layer's reader learns its blob's size (gunzip.WithBlobSize).
func TestLayerProcessorGetsApplyPayloads(t *testing.T) {
	ctx := context.Background()
	store, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte("hi"))
	tw.Close()
	desc := ocispec.Descriptor{MediaType: payloadsSeenType, Digest: digest.FromBytes(layer.Bytes()), Size: int64(layer.Len())}
	if err := content.WriteBlob(ctx, store, "layer", bytes.NewReader(layer.Bytes()), desc); err != nil {
		t.Fatal(err)
	}
	// A parallel-unpack mount: one overlay, an upper and no lower.
	mounts := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"upperdir=" + t.TempDir(), "workdir=" + t.TempDir()}}}
	if _, ok := parallelUpper(mounts); !ok {
		t.Fatal("this package does not apply layers here (in a user namespace), so the test cannot see what it hands on")
	}

	a := Applier{Content: store, Dirs: NewDirs()}
	if _, err := a.Apply(ctx, desc, mounts, gunzip.WithBlobSize()); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	select {
	case payloads := <-seenPayloads:
		if got := gunzip.BlobSizeFrom(payloads); got != desc.Size {
			t.Errorf("the layer's processor read a blob size of %d, want %d", got, desc.Size)
		}
	default:
		t.Fatal("the layer's stream processor was never opened")
	}
}
