package peers

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/internal/metadatatest"
)

// testReadTimeout is short so that the stall tests are quick; a peer on
// loopback that is not stalled answers well within it.
const testReadTimeout = time.Second

// clusterKey writes a new cluster key and returns its path.
func clusterKey(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cluster.key")
	if err := GenerateClusterKey(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// testConfig is a node on a random loopback port.
func testConfig(t *testing.T, key string, boot ...*Node) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ListenAddr = "/ip4/127.0.0.1/tcp/0"
	cfg.KeyFile = filepath.Join(t.TempDir(), "node.key")
	cfg.ClusterKeyFile = key
	cfg.SpoolDir = t.TempDir()
	cfg.FindTimeout = 5 * time.Second // generous: a busy machine under -race
	cfg.ReadTimeout = testReadTimeout
	for _, b := range boot {
		cfg.Bootstrap = append(cfg.Bootstrap, b.Addrs()...)
	}
	return cfg
}

// startNode starts a node closed at the end of the test.
func startNode(t *testing.T, cfg Config, store content.Provider) *Node {
	t.Helper()
	n, err := New(context.Background(), cfg, store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return n
}

// awaitMesh waits until every node has all the others as live peers.
func awaitMesh(t *testing.T, nodes ...*Node) {
	t.Helper()
	await.Until(t, 20*time.Second, "the nodes to see each other", func() bool {
		for _, n := range nodes {
			if len(n.Peers()) < len(nodes)-1 {
				return false
			}
		}
		return true
	})
}

// advertise advertises dgst from n, retrying while the DHT is settling.
func advertise(t *testing.T, n *Node, dgst digest.Digest) {
	t.Helper()
	var last error
	if !await.Within(20*time.Second, func() bool { last = n.Advertise(context.Background(), dgst); return last == nil }) {
		t.Fatalf("advertise %s: %v", dgst, last)
	}
}

// localStore is a containerd local content store in a temporary dir.
func localStore(t *testing.T) content.Store {
	t.Helper()
	s, err := local.NewStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// randomBlob returns size random bytes and their digest.
func randomBlob(t *testing.T, size int) ([]byte, digest.Digest) {
	t.Helper()
	b := make([]byte, size)
	rand.Read(b)
	return b, digest.FromBytes(b)
}

// put writes b into the store.
func put(t *testing.T, s content.Store, b []byte) digest.Digest {
	t.Helper()
	return metadatatest.WriteBlob(t, context.Background(), s, "application/octet-stream", b).Digest
}

// fakeStore answers every digest in sizes with the blob blob returns:
// a peer that lies, or one that stalls.
type fakeStore struct {
	sizes map[digest.Digest]int64
	blob  func(size int64) content.ReaderAt
}

func (f fakeStore) ReaderAt(_ context.Context, desc ocispec.Descriptor) (content.ReaderAt, error) {
	size, ok := f.sizes[desc.Digest]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return f.blob(size), nil
}

// memBlob is a content.ReaderAt over bytes.
type memBlob struct{ *bytes.Reader }

func (memBlob) Close() error { return nil }

// liar serves size bytes of zeros under any digest.
func liar(size int64) content.ReaderAt { return memBlob{bytes.NewReader(make([]byte, size))} }

// stallBlob serves its first 1000 bytes, then blocks until released.
type stallBlob struct {
	size    int64
	release <-chan struct{}
}

func (s stallBlob) ReadAt(p []byte, off int64) (int, error) {
	if off >= 1000 {
		<-s.release
		return 0, io.ErrUnexpectedEOF
	}
	return copy(p, make([]byte, min(int64(len(p)), 1000-off))), nil
}
func (s stallBlob) Close() error { return nil }
func (s stallBlob) Size() int64  { return s.size }

// readAll reads and closes rc.
func readAll(t *testing.T, rc io.ReadCloser) []byte {
	t.Helper()
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pair starts a node serving store and a second node bootstrapped to it,
// each config edited by its func (nil: none), and waits until they see
// each other.
func pair(t *testing.T, store content.Provider, editA, editC func(*Config)) (a, c *Node) {
	t.Helper()
	key := clusterKey(t)
	cfgA := testConfig(t, key)
	if editA != nil {
		editA(&cfgA)
	}
	a = startNode(t, cfgA, store)
	cfgC := testConfig(t, key, a)
	if editC != nil {
		editC(&cfgC)
	}
	c = startNode(t, cfgC, localStore(t))
	awaitMesh(t, a, c)
	return a, c
}

// held puts a random blob of size bytes in store and advertises it from n.
func held(t *testing.T, store content.Store, n *Node, size int) ([]byte, digest.Digest) {
	t.Helper()
	b, _ := randomBlob(t, size)
	d := put(t, store, b)
	advertise(t, n, d)
	return b, d
}
