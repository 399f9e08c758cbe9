package peers

import (
	"bytes"
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/opencontainers/go-digest"

	"github.com/pullwise/pullwise/internal/await"
	"github.com/pullwise/pullwise/transfer/health"
)

// TestFetchFromAPeer: C fetches a blob A holds, whole and from offsets,
// and gets exactly its bytes; the counters on both sides say so.
func TestFetchFromAPeer(t *testing.T) {
	key := clusterKey(t)
	store := localStore(t)
	a := startNode(t, testConfig(t, key), store)
	b := startNode(t, testConfig(t, key, a), localStore(t))
	c := startNode(t, testConfig(t, key, a, b), localStore(t))
	awaitMesh(t, a, b, c)
	blob, dgst := held(t, store, a, 300<<10)

	var fetched int64
	for _, tc := range []struct {
		name   string
		offset int64
	}{
		{"whole", 0},
		{"from an offset", 123457},
		{"last byte", int64(len(blob)) - 1},
		{"at the end", int64(len(blob))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc, from, err := c.Fetch(context.Background(), dgst, int64(len(blob)), tc.offset)
			if err != nil {
				t.Fatal(err)
			}
			fetched += int64(len(blob))
			if got := readAll(t, rc); !bytes.Equal(got, blob[tc.offset:]) {
				t.Fatalf("got %d bytes, not the blob's %d from offset %d", len(got), len(blob)-int(tc.offset), tc.offset)
			}
			if from != a.ID().String() {
				t.Fatalf("served by %s, want A %s", from, a.ID())
			}
		})
	}
	if s := c.Stats(); s.BytesFetched != fetched || len(s.FetchFailures) != 0 {
		t.Fatalf("C stats %+v, want %d bytes fetched and no failure", s, fetched)
	}
	if s := a.Stats(); s.BytesServed != fetched {
		t.Fatalf("A served %d bytes, want %d", s.BytesServed, fetched)
	}
	if entries, _ := os.ReadDir(c.cfg.SpoolDir); len(entries) != 0 {
		t.Fatalf("spool dir holds %d files after the fetches", len(entries))
	}
}

// TestFetchMisses: a blob no peer holds, a blob a peer dropped from its
// store after advertising it, and an unknown size all end in ErrNotFound
// quickly, so the caller can go to the registry.
func TestFetchMisses(t *testing.T) {
	store := localStore(t)
	const findTimeout = 500 * time.Millisecond
	a, c := pair(t, store, nil, func(cfg *Config) { cfg.FindTimeout = findTimeout })
	_, gone := held(t, store, a, 1000)
	if err := store.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	_, never := randomBlob(t, 10)

	for _, tc := range []struct {
		name   string
		dgst   digest.Digest
		reason string
	}{
		{"nobody has it", never, ""},
		{"removed by GC after it was advertised", gone, ReasonRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.Stats().FetchFailures
			start := time.Now()
			_, _, err := c.Fetch(context.Background(), tc.dgst, 1000, 0)
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("err %v, want ErrNotFound", err)
			}
			if took := time.Since(start); took > findTimeout+testReadTimeout {
				t.Fatalf("a miss took %s", took)
			}
			after := c.Stats().FetchFailures
			if after[ReasonNoPeer] != before[ReasonNoPeer]+1 {
				t.Fatalf("no_peer %d -> %d, want one more", before[ReasonNoPeer], after[ReasonNoPeer])
			}
			if tc.reason != "" && after[tc.reason] != before[tc.reason]+1 {
				t.Fatalf("%s %d -> %d, want one more", tc.reason, before[tc.reason], after[tc.reason])
			}
		})
	}
}

// TestBadPeersAreSkipped: a peer that sends wrong bytes and a peer that
// stalls are each given up on, and the blob comes from the honest peer;
// with only a bad peer, Fetch says ErrNotFound and returns no byte.
func TestBadPeersAreSkipped(t *testing.T) {
	key := clusterKey(t)
	honest := localStore(t)
	blob, _ := randomBlob(t, 200<<10)
	shared := put(t, honest, blob)
	_, lie := randomBlob(t, 200<<10)
	_, stall := randomBlob(t, 200<<10)
	sizes := map[digest.Digest]int64{shared: int64(len(blob)), lie: int64(len(blob)), stall: int64(len(blob))}
	release := make(chan struct{})

	a := startNode(t, testConfig(t, key), honest)
	l := startNode(t, testConfig(t, key, a), fakeStore{sizes, liar})
	s := startNode(t, testConfig(t, key, a, l), fakeStore{sizes, func(size int64) content.ReaderAt {
		return stallBlob{size, release}
	}})
	c := startNode(t, testConfig(t, key, a, l, s), localStore(t))
	// Closed before the nodes (cleanups run last first), so the stalled
	// server's read returns and its node can close.
	t.Cleanup(func() { close(release) })
	awaitMesh(t, a, l, s, c)
	for _, n := range []*Node{a, l, s} {
		advertise(t, n, shared)
	}
	advertise(t, l, lie)
	advertise(t, s, stall)

	t.Run("an honest peer among bad ones", func(t *testing.T) {
		rc, from, err := c.Fetch(context.Background(), shared, int64(len(blob)), 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := readAll(t, rc); !bytes.Equal(got, blob) || from != a.ID().String() {
			t.Fatalf("got %d bytes from %s, want the blob from A %s", len(got), from, a.ID())
		}
	})
	for _, tc := range []struct {
		name   string
		dgst   digest.Digest
		reason string
		least  time.Duration
	}{
		{"only a liar", lie, ReasonCorrupt, 0},
		{"only a staller", stall, ReasonStalled, testReadTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.Stats()
			start := time.Now()
			rc, _, err := c.Fetch(context.Background(), tc.dgst, int64(len(blob)), 0)
			if !errors.Is(err, ErrNotFound) || rc != nil {
				t.Fatalf("err %v, want ErrNotFound and no reader", err)
			}
			if took := time.Since(start); took < tc.least || took > tc.least+10*time.Second {
				t.Fatalf("took %s, want about %s", took, tc.least)
			}
			after := c.Stats()
			if after.FetchFailures[tc.reason] != before.FetchFailures[tc.reason]+1 {
				t.Fatalf("%s failures %d -> %d, want one more", tc.reason, before.FetchFailures[tc.reason], after.FetchFailures[tc.reason])
			}
			if after.BytesFetched != before.BytesFetched {
				t.Fatalf("unverified bytes counted as fetched: %d -> %d", before.BytesFetched, after.BytesFetched)
			}
		})
	}
}

// TestOtherClusterKeyIsShutOut: a node with another cluster key can
// neither connect to the cluster nor fetch from it.
func TestOtherClusterKeyIsShutOut(t *testing.T) {
	store := localStore(t)
	blob, _ := randomBlob(t, 1000)
	dgst := put(t, store, blob)
	a := startNode(t, testConfig(t, clusterKey(t)), store)
	cfg := testConfig(t, clusterKey(t), a)
	cfg.FindTimeout = 200 * time.Millisecond
	x := startNode(t, cfg, localStore(t))

	// With the wrong key each side reads the other's bytes as noise: the
	// dial fails at once, or the handshake waits for bytes that never
	// come until the context ends. Either way it fails.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := x.host.Connect(ctx, peer.AddrInfo{ID: a.ID(), Addrs: a.host.Addrs()}); err == nil {
		t.Fatal("a node with another cluster key connected")
	}
	if _, _, err := x.Fetch(context.Background(), dgst, 1000, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("fetch: %v, want ErrNotFound", err)
	}
	if len(a.Peers()) != 0 || len(x.Peers()) != 0 {
		t.Fatalf("peers %v and %v, want none", a.Peers(), x.Peers())
	}
}

// TestUploadLimitIsShared: two fetches at once from a node capped at
// 128 KiB/s take at least as long as their bytes at that rate.
func TestUploadLimitIsShared(t *testing.T) {
	store := localStore(t)
	a, c := pair(t, store, func(cfg *Config) {
		cfg.UploadBytesPerSec = 128 << 10
		cfg.ReadTimeout = 5 * time.Second
	}, nil)
	var blobs [][]byte
	for range 2 {
		b, _ := held(t, store, a, 96<<10)
		blobs = append(blobs, b)
	}

	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(blobs))
	for i, b := range blobs {
		wg.Go(func() {
			rc, _, err := c.Fetch(context.Background(), digest.FromBytes(b), int64(len(b)), 0)
			if err == nil {
				rc.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// 192 KiB less the one-chunk burst at 128 KiB/s is 1.25 s; a lower
	// bound only, so a slow machine cannot fail it.
	if took := time.Since(start); took < time.Second {
		t.Fatalf("192 KiB served in %s under a 128 KiB/s cap", took)
	}
}

// TestBootstrapByAddress: a "dns:host:port" entry (here an address, so
// that no lookup leaves the machine) finds the node there by probing
// its peer ID.
func TestBootstrapByAddress(t *testing.T) {
	key := clusterKey(t)
	a := startNode(t, testConfig(t, key), localStore(t))
	cfg := testConfig(t, key)
	cfg.Bootstrap = []string{"dns:127.0.0.1:" + tcpPort(t, a)}
	b := startNode(t, cfg, localStore(t))
	awaitMesh(t, a, b)
}

// tcpPort is the port n listens on.
func tcpPort(t *testing.T, n *Node) string {
	t.Helper()
	for _, a := range n.host.Addrs() {
		if p, err := a.ValueForProtocol(6 /* P_TCP */); err == nil {
			return p
		}
	}
	t.Fatal("no tcp address")
	return ""
}

// TestOfferedBlobIsFound: a blob offered, not advertised in line, is
// announced by the node's own loop, and a peer then fetches it; a digest
// offered that the store does not hold is never announced.
func TestOfferedBlobIsFound(t *testing.T) {
	key := clusterKey(t)
	store := localStore(t)
	a := startNode(t, testConfig(t, key), store)
	c := startNode(t, testConfig(t, key, a), localStore(t))
	awaitMesh(t, a, c)
	blob, _ := randomBlob(t, 64<<10)
	dgst := put(t, store, blob)
	_, missing := randomBlob(t, 1<<10)
	a.Offer(dgst, missing)
	await.Until(t, 10*time.Second, "the offered blob to be fetched from A", func() bool {
		rc, _, err := c.Fetch(context.Background(), dgst, int64(len(blob)), 0)
		if err != nil {
			return false
		}
		if got := readAll(t, rc); !bytes.Equal(got, blob) {
			t.Fatal("fetched bytes differ from the offered blob")
		}
		return true
	})
	await.Until(t, 10*time.Second, "A to forget the digest it does not hold", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		_, ok := a.held[missing]
		return !ok
	})
}

// TestFailingPeerIsRemembered: with the node's health table, a peer that
// sent wrong bytes is marked down there (pullctl registries lists it),
// and the next fetch skips it, counted as "down", for its cooldown.
func TestFailingPeerIsRemembered(t *testing.T) {
	key := clusterKey(t)
	_, lie := randomBlob(t, 100<<10)
	sizes := map[digest.Digest]int64{lie: 100 << 10}
	table := health.New(health.Config{Cooldown: time.Hour, MaxCooldown: time.Hour})
	l := startNode(t, testConfig(t, key), fakeStore{sizes, liar})
	cfg := testConfig(t, key, l)
	cfg.Health = table
	c := startNode(t, cfg, localStore(t))
	awaitMesh(t, l, c)
	advertise(t, l, lie)

	for i, want := range []string{ReasonCorrupt, ReasonDown} {
		before := c.Stats().FetchFailures[want]
		if _, _, err := c.Fetch(context.Background(), lie, 100<<10, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("fetch %d: %v, want ErrNotFound", i, err)
		}
		if got := c.Stats().FetchFailures[want]; got != before+1 {
			t.Fatalf("fetch %d: %s failures %d -> %d, want one more", i, want, before, got)
		}
	}
	var st *health.Status
	for _, h := range table.Hosts() {
		if h.Key == PeerKey(l.ID()) {
			st = &h
		}
	}
	if st == nil || st.Up || st.Requests[health.ServerError] != 1 || st.Requests[health.Skipped] != 1 {
		t.Fatalf("the liar in the health table: %+v, want down after one server_error and one skip", st)
	}
}

// breakingBlob serves blob's first half, then fails: a peer that breaks
// off mid-blob.
type breakingBlob struct{ blob []byte }

func (b breakingBlob) ReadAt(p []byte, off int64) (int, error) {
	half := int64(len(b.blob) / 2)
	if off >= half {
		return 0, errors.New("disk gone")
	}
	return copy(p, b.blob[off:half]), nil
}
func (b breakingBlob) Close() error { return nil }
func (b breakingBlob) Size() int64  { return int64(len(b.blob)) }

// TestResumeFromAnotherPeer: the blob's owner breaks off half way; the
// next peer is asked only for the rest, from where the spool ends, as
// containerd resumes a registry's body with a Range request, and the whole
// is verified before any byte is handed on.
func TestResumeFromAnotherPeer(t *testing.T) {
	key := clusterKey(t)
	honest := localStore(t)
	a := startNode(t, testConfig(t, key), honest)
	var blob []byte
	var d digest.Digest
	breaker := &fakeStore{sizes: map[digest.Digest]int64{}}
	b := startNode(t, testConfig(t, key, a), breaker)
	c := startNode(t, testConfig(t, key, a, b), localStore(t))
	awaitMesh(t, a, b, c)
	blob, d = ownedBy(t, b.ID(), []peer.ID{a.ID(), b.ID(), c.ID()}, 512<<10)
	breaker.sizes[d] = int64(len(blob))
	breaker.blob = func(int64) content.ReaderAt { return breakingBlob{blob} }
	put(t, honest, blob)
	advertise(t, a, d)

	before := c.Stats().FetchFailures[ReasonBroken]
	rc, from, err := c.Fetch(context.Background(), d, int64(len(blob)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, rc); !bytes.Equal(got, blob) || from != a.ID().String() {
		t.Fatalf("%d bytes from %s, want the blob, finished by A (%s)", len(got), from, a.ID())
	}
	if got := c.Stats().FetchFailures[ReasonBroken]; got != before+1 {
		t.Fatalf("broken failures %d -> %d, want one more: the owner's", before, got)
	}
	if served := a.Stats().BytesServed; served >= int64(len(blob)) || served == 0 {
		t.Fatalf("A served %d bytes of %d: want only the rest after the owner's part", served, len(blob))
	}
}
