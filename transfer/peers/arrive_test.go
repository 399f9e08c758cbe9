package peers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pullwise/pullwise/internal/await"
)

// ownedBy returns a random blob of size bytes whose Owner among ids is
// owner.
func ownedBy(t *testing.T, owner peer.ID, ids []peer.ID, size int) ([]byte, digest.Digest) {
	t.Helper()
	for {
		b, d := randomBlob(t, size)
		if Owner(d, ids) == owner {
			return b, d
		}
	}
}

// fetched is what a Fetch gave: the bytes read, the peer, the error.
type fetched struct {
	blob []byte
	from string
	err  error
	took time.Duration
}

// fetchAsync runs n.Fetch of the whole blob dgst in a goroutine; the
// channel gets what came of it.
func fetchAsync(n *Node, dgst digest.Digest, size int) <-chan fetched {
	ch := make(chan fetched, 1)
	go func() {
		start := time.Now()
		rc, from, err := n.Fetch(context.Background(), dgst, int64(size), 0)
		var b []byte
		if err == nil {
			b, err = io.ReadAll(rc)
			rc.Close()
		}
		ch <- fetched{b, from, err, time.Since(start)}
	}()
	return ch
}

// result waits for a fetch to end.
func result(t *testing.T, ch <-chan fetched) fetched {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the fetch did not end")
		return fetched{}
	}
}

// awaitFollower waits until a request is waiting at n for an arrival.
func awaitFollower(t *testing.T, n *Node) {
	t.Helper()
	await.Until(t, 10*time.Second, "a follow request to wait at the owner", func() bool {
		n.sh.mu.Lock()
		defer n.sh.mu.Unlock()
		return n.sh.waiting > 0
	})
}

// awaitServed waits until n sent at least total bytes to its peers.
func awaitServed(t *testing.T, n *Node, total int64) {
	t.Helper()
	await.Until(t, 10*time.Second, "the follower to read the bytes arrived", func() bool {
		return n.Stats().BytesServed >= total
	})
}

// spoolFiles counts the files in n's SpoolDir.
func spoolFiles(t *testing.T, n *Node) int {
	t.Helper()
	entries, err := os.ReadDir(n.cfg.SpoolDir)
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestFollowWhileArriving: B asks A, the owner of d, before A has read
// a byte of d from its registry; A's bytes reach B step by step as they
// arrive, B returns exactly the blob once it is whole, and B asked
// A directly, without a DHT lookup. A's store never held d. A follower
// kept waiting longer than ReadTimeout for the download to start is
// kept alive by wait lines.
func TestFollowWhileArriving(t *testing.T) {
	a, b := pair(t, localStore(t), nil, nil)
	const size, steps = 256 << 10, 8
	for _, tc := range []struct {
		name  string
		start time.Duration // how long A's download takes to start
	}{
		{"the download starts at once", 0},
		{"the download starts after twice ReadTimeout", 2 * testReadTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob, d := ownedBy(t, a.ID(), []peer.ID{a.ID(), b.ID()}, size)
			done := a.Expect(d)
			defer done()
			before, lookups := a.Stats(), b.lookups.Load()
			res := fetchAsync(b, d, size)
			awaitFollower(t, a)
			// The wait itself is under test: a sleep, not a condition.
			time.Sleep(tc.start)

			w := a.Arriving(d, 0, size)
			for i := range steps {
				part := blob[i*size/steps : (i+1)*size/steps]
				if k, err := w.Write(part); k != len(part) || err != nil {
					t.Fatalf("write %d: %d, %v", i, k, err)
				}
				awaitServed(t, a, before.BytesServed+int64((i+1)*size/steps))
				if i == steps-1 {
					// The blob is whole now: the fetch may end.
					break
				}
				select {
				case r := <-res:
					t.Fatalf("the fetch ended before the blob was whole: %v", r.err)
				default:
				}
			}
			w.Close()

			r := result(t, res)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if !bytes.Equal(r.blob, blob) || r.from != a.ID().String() {
				t.Fatalf("got %d bytes from %s, want the blob from A %s", len(r.blob), r.from, a.ID())
			}
			if got := b.lookups.Load(); got != lookups {
				t.Fatalf("B looked up providers %d times, want none: A is the owner", got-lookups)
			}
			if got := a.Stats().ServedArriving; got != before.ServedArriving+1 {
				t.Fatalf("A served %d blobs while arriving, want %d", got, before.ServedArriving+1)
			}
			want := fmt.Sprintf("# HELP pullwise_peer_blobs_served_arriving_total Blobs this node sent whole to a peer as they arrived from a registry.\n"+
				"# TYPE pullwise_peer_blobs_served_arriving_total counter\npullwise_peer_blobs_served_arriving_total %d\n", before.ServedArriving+1)
			if err := testutil.CollectAndCompare(a.Collector(), strings.NewReader(want), "pullwise_peer_blobs_served_arriving_total"); err != nil {
				t.Fatal(err)
			}
			if a.holds(context.Background(), d) {
				t.Fatal("A's store holds the blob: it was not served while arriving")
			}
		})
	}
}

// TestOwnerRefuses: an owner that will not download d refuses B, and
// counts the refusal: when it neither holds nor expects d, after
// at once; when it expects d but is itself asking another node (its
// peers differ from B's) or got d from a peer, at once, so that no two
// nodes wait for each other. B's Fetch then says ErrNotFound quickly,
// without counting the owner's miss as a failure.
func TestOwnerRefuses(t *testing.T) {
	a, b := pair(t, localStore(t), nil, func(cfg *Config) { cfg.FindTimeout = 500 * time.Millisecond })
	for _, tc := range []struct {
		name  string
		setup func(d digest.Digest) (undo func())
		least time.Duration
	}{
		{"it does not pull the blob", func(digest.Digest) func() { return func() {} }, 0},
		{"it asks another owner itself", func(d digest.Digest) func() {
			done := a.Expect(d)
			a.sh.ask(d, 1)
			return func() { a.sh.ask(d, -1); done() }
		}, 0},
		{"it got the blob from a peer", func(d digest.Digest) func() {
			done := a.Expect(d)
			a.sh.fetched(d)
			return done
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, d := ownedBy(t, a.ID(), []peer.ID{a.ID(), b.ID()}, 1000)
			defer tc.setup(d)()
			before, failures := a.Stats().Refused, b.Stats().FetchFailures

			r := result(t, fetchAsync(b, d, 1000))
			if !errors.Is(r.err, ErrNotFound) || r.blob != nil {
				t.Fatalf("err %v with %d bytes, want ErrNotFound", r.err, len(r.blob))
			}
			if r.took < tc.least || r.took > 3*time.Second {
				t.Fatalf("the miss took %s, want %s and a little", r.took, tc.least)
			}
			if got := a.Stats().Refused; got != before+1 {
				t.Fatalf("A refused %d requests, want 1", got-before)
			}
			after := b.Stats().FetchFailures
			if after[ReasonRefused] != failures[ReasonRefused] || after[ReasonNoPeer] != failures[ReasonNoPeer]+1 {
				t.Fatalf("B's failures %v -> %v, want only one more no_peer", failures, after)
			}
		})
	}
}

// TestOwnerDiesMidArrival: A, the owner, closes while B follows its
// arrival. B fails over to a peer that holds the blob, or says
// ErrNotFound when none does, and never returns a byte it did not
// verify; A leaves no file behind.
func TestOwnerDiesMidArrival(t *testing.T) {
	for _, tc := range []struct {
		name   string
		holder bool // a third node C holds the blob in its store
	}{
		{"another peer holds the blob", true},
		{"no other peer holds it", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := clusterKey(t)
			a := startNode(t, testConfig(t, key), localStore(t))
			cfgB := testConfig(t, key, a)
			cfgB.FindTimeout = time.Second
			b := startNode(t, cfgB, localStore(t))
			nodes, ids := []*Node{a, b}, []peer.ID{a.ID(), b.ID()}
			storeC := localStore(t)
			var c *Node
			if tc.holder {
				c = startNode(t, testConfig(t, key, a, b), storeC)
				nodes, ids = append(nodes, c), append(ids, c.ID())
			}
			awaitMesh(t, nodes...)
			const size = 200 << 10
			blob, d := ownedBy(t, a.ID(), ids, size)
			if tc.holder {
				put(t, storeC, blob)
				advertise(t, c, d)
			}

			defer a.Expect(d)()
			res := fetchAsync(b, d, size)
			awaitFollower(t, a)
			w := a.Arriving(d, 0, size)
			w.Write(blob[:size/2])
			awaitServed(t, a, size/2)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			// The node's own download goes on, unshared.
			if k, err := w.Write(blob[size/2:]); k != size-size/2 || err != nil {
				t.Fatalf("write after close: %d, %v", k, err)
			}
			w.Close()

			r := result(t, res)
			switch {
			case tc.holder && (r.err != nil || !bytes.Equal(r.blob, blob) || r.from != c.ID().String()):
				t.Fatalf("got %d bytes from %s (%v), want the blob from C", len(r.blob), r.from, r.err)
			case !tc.holder && (!errors.Is(r.err, ErrNotFound) || r.blob != nil):
				t.Fatalf("err %v with %d bytes, want ErrNotFound", r.err, len(r.blob))
			}
			if got, want := b.Stats().BytesFetched, int64(len(r.blob)); got != want {
				t.Fatalf("B counted %d bytes fetched, want the %d verified", got, want)
			}
			if k := spoolFiles(t, a); k != 0 {
				t.Fatalf("A's spool dir holds %d files after Close", k)
			}
		})
	}
}

// TestResume: an arrival whose body broke goes on with a body resuming
// where the kept bytes end, and the follower gets the whole blob; a
// resume from anywhere else abandons the arrival, and the follower
// gets ErrNotFound, never a wrong byte.
func TestResume(t *testing.T) {
	a, b := pair(t, localStore(t), nil, func(cfg *Config) { cfg.FindTimeout = 500 * time.Millisecond })
	const size, half = 128 << 10, 64 << 10
	for _, tc := range []struct {
		name   string
		resume int64
		whole  bool // the follower gets the blob, else ErrNotFound
	}{
		{"where the kept bytes end", half, true},
		{"from the start again", 0, false},
		{"past the kept bytes", half + 1, false},
		{"before the kept bytes end", half - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob, d := ownedBy(t, a.ID(), []peer.ID{a.ID(), b.ID()}, size)
			defer a.Expect(d)()
			served := a.Stats().BytesServed
			res := fetchAsync(b, d, size)
			awaitFollower(t, a)
			w := a.Arriving(d, 0, size)
			w.Write(blob[:half])
			w.Close()
			awaitServed(t, a, served+half)
			w = a.Arriving(d, tc.resume, size)
			w.Write(blob[tc.resume:])
			w.Close()

			r := result(t, res)
			switch {
			case r.err == nil && !bytes.Equal(r.blob, blob):
				t.Fatalf("got %d wrong bytes", len(r.blob))
			case tc.whole && r.err != nil:
				t.Fatal(r.err)
			case !tc.whole && !errors.Is(r.err, ErrNotFound):
				t.Fatalf("err %v, want ErrNotFound", r.err)
			}
		})
	}
}

// TestDoneRemovesArrivals: an arrival's file goes when the last pull
// expecting its blob is done: at once when incomplete or when the store
// holds the blob, a little later when complete. Bytes no pull expects
// are not kept at all.
func TestDoneRemovesArrivals(t *testing.T) {
	store := localStore(t)
	n := startNode(t, testConfig(t, clusterKey(t)), store)
	const linger = 2 * time.Second
	n.sh.mu.Lock()
	n.sh.linger = linger
	n.sh.mu.Unlock()

	t.Run("no pull expects the blob", func(t *testing.T) {
		blob, d := randomBlob(t, 1000)
		w := n.Arriving(d, 0, int64(len(blob)))
		w.Write(blob)
		w.Close()
		if k := spoolFiles(t, n); k != 0 {
			t.Fatalf("%d files kept for a blob nobody expects", k)
		}
	})
	for _, tc := range []struct {
		name    string
		written int  // of 1000 bytes
		stored  bool // the store holds the blob when the pull is done
		lingers bool
	}{
		{"incomplete", 500, false, false},
		{"complete", 1000, false, true},
		{"complete and in the store", 1000, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blob, d := randomBlob(t, 1000)
			// Two pulls of the blob: the first done leaves it.
			done1, done2 := n.Expect(d), n.Expect(d)
			w := n.Arriving(d, 0, int64(len(blob)))
			w.Write(blob[:tc.written])
			w.Close()
			if tc.stored {
				put(t, store, blob)
			}
			done1()
			done1() // once only: it must not end the other pull's
			if k := spoolFiles(t, n); k != 1 {
				t.Fatalf("%d files while a pull still expects the blob, want 1", k)
			}
			done2()
			if k := spoolFiles(t, n); tc.lingers != (k == 1) {
				t.Fatalf("%d files just after the last pull is done, want lingering %v", k, tc.lingers)
			}
			await.Until(t, 5*linger, "the arrival's file to go", func() bool { return spoolFiles(t, n) == 0 })
		})
	}
}

// TestOwnerSendsToClaimant: the owner of d (A) does not pull it. The
// first peer to ask (B) is told to fetch d from its registry, and a later
// one (C) is sent by A to follow B's download: d crosses the registry
// link once, though its owner never holds it.
func TestOwnerSendsToClaimant(t *testing.T) {
	a, b, c := trio(t)
	blob, d := ownedBy(t, a.ID(), []peer.ID{a.ID(), b.ID(), c.ID()}, 200<<10)
	defer b.Expect(d)()
	defer c.Expect(d)()

	if r := result(t, fetchAsync(b, d, len(blob))); !errors.Is(r.err, ErrNotFound) {
		t.Fatalf("B, first to ask: %v, want ErrNotFound (fetch it from the registry)", r.err)
	}
	if got := a.claims.holder(d, time.Now()); got != b.ID() {
		t.Fatalf("A's claimant of d is %q, want B", got)
	}
	ch := fetchAsync(c, d, len(blob))
	awaitFollower(t, b)
	w := b.Arriving(d, 0, int64(len(blob)))
	for off := 0; off < len(blob); off += 64 << 10 {
		w.Write(blob[off:min(off+64<<10, len(blob))])
	}
	w.Close()
	r := result(t, ch)
	if r.err != nil || !bytes.Equal(r.blob, blob) || r.from != b.ID().String() {
		t.Fatalf("C: %d bytes from %s, %v; want the blob from B (%s)", len(r.blob), r.from, r.err, b.ID())
	}
	if s := a.Stats(); s.BytesServed != 0 {
		t.Fatalf("A served %d bytes of a blob it never held", s.BytesServed)
	}
}

// TestStaleClaimIsTakenOver: the peer A sent others to no longer fetches
// d (its pull ended without it). The next peer A sends there is refused,
// tells A, and becomes the one A sends the others to.
func TestStaleClaimIsTakenOver(t *testing.T) {
	a, b, c := trio(t)
	blob, d := ownedBy(t, a.ID(), []peer.ID{a.ID(), b.ID(), c.ID()}, 1000)

	done := b.Expect(d)
	if r := result(t, fetchAsync(b, d, len(blob))); !errors.Is(r.err, ErrNotFound) {
		t.Fatalf("B, first to ask: %v, want ErrNotFound", r.err)
	}
	done() // B's pull ends without d
	defer c.Expect(d)()
	if r := result(t, fetchAsync(c, d, len(blob))); !errors.Is(r.err, ErrNotFound) {
		t.Fatalf("C, sent to B: %v, want ErrNotFound", r.err)
	}
	if got := a.claims.holder(d, time.Now()); got != c.ID() {
		t.Fatalf("A sends peers asking for d to %q, want C (%s) now", got, c.ID())
	}
}

// trio starts three nodes of one cluster, each with its own store, and
// waits until they know each other.
func trio(t *testing.T) (a, b, c *Node) {
	t.Helper()
	key := clusterKey(t)
	a = startNode(t, testConfig(t, key), localStore(t))
	b = startNode(t, testConfig(t, key, a), localStore(t))
	c = startNode(t, testConfig(t, key, a, b), localStore(t))
	awaitMesh(t, a, b, c)
	return a, b, c
}
