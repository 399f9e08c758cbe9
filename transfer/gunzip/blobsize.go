package gunzip

import (
	"context"
	"encoding/binary"
	"maps"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/typeurl/v2"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// WithBlobSize is an apply option that tells a gzip layer's reader how
// large its blob is. containerd gives a stream processor the blob's bytes,
// not its descriptor; what else a processor needs comes as a payload
// (diff.ApplyConfig.ProcessorPayloads), which every applier passes on.
// Knowing the size, a layer read whole is read into one buffer, rather
// than into buffers doubling as it turns out larger, each copied into the
// next and each new memory to fault in; and a layer too large to read
// whole is streamed from its first byte, rather than after its first
// maxBlob bytes were read into memory.
//
// An option after it that sets the payloads anew (diff.WithPayloads, as
// for decryption) takes the size away, and the layer is read as before.
func WithBlobSize() diff.ApplyOpt {
	return func(_ context.Context, desc ocispec.Descriptor, c *diff.ApplyConfig) error {
		// A copy: the map may be one a pull's layers share.
		payloads := maps.Clone(c.ProcessorPayloads)
		if payloads == nil {
			payloads = map[string]typeurl.Any{}
		}
		payloads[sizePayloadID] = sizePayload(desc.Size)
		c.ProcessorPayloads = payloads
		return nil
	}
}

// BlobSizeFrom is the size WithBlobSize gave a layer's payloads, or 0
// when none did. It is a hint: a processor before this one may have
// changed the stream's length.
func BlobSizeFrom(payloads map[string]typeurl.Any) int64 {
	n, _ := payloads[sizePayloadID].(sizePayload)
	return max(int64(n), 0)
}

// sizePayloadID keys the payload, as a processor's ID keys those of the
// stream_processors in containerd's config.
const sizePayloadID = "io.containerd.pullwise.gunzip.v1.blob-size"

// sizePayload is handed over as is within the daemon. Through a proxy
// differ it is marshalled with the other payloads, and the far side,
// knowing nothing of it, reads no size: the layer is read as before.
type sizePayload int64

func (sizePayload) GetTypeUrl() string { return sizePayloadID }
func (s sizePayload) GetValue() []byte { return binary.AppendVarint(nil, int64(s)) }
