package cripull

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/imgcrypt/v2"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/transfer/applyopts"
	"github.com/pullwise/pullwise/transfer/gunzip"
)

// configRecorder is a differ that keeps the config a layer's options make.
type configRecorder struct{ got diff.ApplyConfig }

func (r *configRecorder) Apply(ctx context.Context, desc ocispec.Descriptor, _ []mount.Mount, opts ...diff.ApplyOpt) (ocispec.Descriptor, error) {
	r.got = diff.ApplyConfig{}
	for _, o := range opts {
		if err := o(ctx, desc, &r.got); err != nil {
			return ocispec.Descriptor{}, err
		}
	}
	return desc, nil
}

// An encrypted image's layers are read knowing their blob's size, as any
// other: the unpacking's option gives each layer the size
// (gunzip.WithBlobSize), and CRI's decryption option, applied after it
// (applyopts), adds its payload to the layer's rather than setting them
// anew. Would an imgcrypt release replace the map, the layers would be read
// into doubling buffers again; this says so.
func TestDecryptionKeepsTheBlobSize(t *testing.T) {
	desc := ocispec.Descriptor{
		MediaType: "application/vnd.oci.image.layer.v1.tar+gzip+encrypted",
		Digest:    digest.FromString("layer"),
		Size:      4096,
	}
	for _, tc := range []struct {
		name     string
		keyModel string
		decoder  bool
	}{
		{name: "node key model", keyModel: criconfig.KeyModelNode, decoder: true},
		{name: "no decryption", keyModel: "", decoder: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Puller{deps: Deps{Config: criconfig.Images{ImageDecryption: criconfig.ImageDecryption{KeyModel: tc.keyModel}}}}
			r := &configRecorder{}
			ctx := applyopts.With(context.Background(), p.applyOpts()...)
			if _, err := (applyopts.Applier{Applier: r}).Apply(ctx, desc, nil, gunzip.WithBlobSize()); err != nil {
				t.Fatal(err)
			}
			if got := gunzip.BlobSizeFrom(r.got.ProcessorPayloads); got != desc.Size {
				t.Errorf("blob size read from the payloads = %d, want %d", got, desc.Size)
			}
			for _, id := range imgcrypt.PayloadToolIDs {
				if _, ok := r.got.ProcessorPayloads[id]; ok != tc.decoder {
					t.Errorf("payload for %s present = %v, want %v", id, ok, tc.decoder)
				}
			}
		})
	}
}
