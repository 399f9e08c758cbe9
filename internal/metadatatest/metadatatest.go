// Package metadatatest gives tests containerd's own metadata database
// (images, leases, content) on a bolt file in a temporary directory, as
// the daemon runs it, so that stores are tested against the real thing
// rather than a fake.
package metadatatest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins/content/local"
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
