// Package metadatatest gives tests containerd's own metadata database
// (images, leases, content) on a bolt file in a temporary directory, as
// the daemon runs it, so that stores are tested against the real thing
// rather than a fake.
package metadatatest

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	bolt "go.etcd.io/bbolt"
)

// DB opens a metadata database, with a local content store beside it,
// in t's temporary directory; it is closed when t ends. opts are
// metadata.NewDB's (an events publisher, say).
func DB(t testing.TB, opts ...metadata.DBOpt) *metadata.DB {
	t.Helper()
	dir := t.TempDir()
	bdb, err := bolt.Open(filepath.Join(dir, "meta.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bdb.Close() })
	cs, err := local.NewStore(filepath.Join(dir, "content"))
	if err != nil {
		t.Fatal(err)
	}
	db := metadata.NewDB(bdb, cs, nil, opts...)
	if err := db.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return db
}

// WriteBlob writes data to cs as a blob of mediaType and returns its
// descriptor.
func WriteBlob(t testing.TB, ctx context.Context, cs content.Store, mediaType string, data []byte) ocispec.Descriptor {
	t.Helper()
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
	if err := content.WriteBlob(ctx, cs, desc.Digest.String(), bytes.NewReader(data), desc); err != nil {
		t.Fatalf("write %s: %v", mediaType, err)
	}
	return desc
}

// WriteJSON writes v, as JSON, to cs as a blob of mediaType (a manifest, a
// config) and returns its descriptor.
func WriteJSON(t testing.TB, ctx context.Context, cs content.Store, mediaType string, v any) ocispec.Descriptor {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return WriteBlob(t, ctx, cs, mediaType, data)
}
