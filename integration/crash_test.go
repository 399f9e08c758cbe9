package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// What a crash must not leave behind, seen through the daemon once it is
// back: no pull listed or counted in the gauges, and no image record for
// refs (a record is written only once its pull is complete).
func (e *env) requireNothingStale(refs ...string) {
	e.t.Helper()
	if p := e.listPulls(); len(p) != 0 {
		e.t.Fatalf("ListPulls after the crash: %v", p)
	}
	out, err := e.pullctl("pulls")
	if err != nil {
		e.t.Fatalf("pullctl pulls: %v\n%s", err, out)
	}
	for _, ref := range refs {
		if strings.Contains(out, ref) {
			e.t.Fatalf("pullctl pulls lists %s after the crash:\n%s", ref, out)
		}
	}
	for _, g := range []string{`pullwise_pulls_in_flight`, `pullwise_pulls_waiting`} {
		if v := e.metric(g); v != 0 {
			e.t.Fatalf("%s = %v after the crash", g, v)
		}
	}
	for _, ref := range refs {
		st, err := e.images.ImageStatus(context.Background(), criImage(ref), false)
		if err != nil {
			e.t.Fatalf("ImageStatus %s: %v", ref, err)
		}
		if st.GetImage() != nil {
			e.t.Fatalf("CRI knows %s, whose pull the crash cut: %v", ref, st.GetImage())
		}
		if e.recordExists("k8s.io", ref) {
			e.t.Fatalf("an image record %s exists, whose pull the crash cut", ref)
		}
	}
}

func (e *env) recordExists(ns, name string) bool {
	e.t.Helper()
	_, err := e.getImage(ns, name)
	if status.Code(err) == codes.NotFound {
		return false
	}
	if err != nil {
		e.t.Fatalf("get image %s: %v", name, err)
	}
	return true
}

// restartAfterCrash starts containerd again on the root it crashed on.
func (e *env) restartAfterCrash() {
	e.t.Helper()
	start := time.Now()
	e.d.Respawn(e.t)
	e.d.WaitReady(e.t)
	e.t.Logf("containerd back %s after the crash", time.Since(start).Round(time.Millisecond))
}

// blobGets returns, per blob digest, the bytes the registry sent for GETs
// of it, and whether any of them asked for a range.
func blobGets(r *registry.Registry) (bytes map[string]int64, ranged map[string]bool) {
	bytes, ranged = map[string]int64{}, map[string]bool{}
	for _, req := range r.Requests() {
		if req.Kind == registry.KindBlob && req.Method == "GET" {
			bytes[req.Reference] += req.Bytes
			if req.Header.Get("Range") != "" {
				ranged[req.Reference] = true
			}
		}
	}
	return bytes, ranged
}

// copyChunk is how much of a blob containerd holds in memory before it
// writes to the content store's ingest file (content.Copy reads 1 MiB at
// a time): what a crash can lose of a layer in flight.
const copyChunk = 1 << 20

// TestCrashDuringDownload: SIGKILL while a layer is half-way down. After
// the restart the pull succeeds without fetching again the layers that
// were in, and resumes the cut one from the last chunk written.
func TestCrashDuringDownload(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("crash/download", "v1", registry.Image{Layers: []int64{512 << 10, 512 << 10, 512 << 10, 4 << 20}, Seed: 3000})
	slow := img.Layers[3].String()
	e.upstream.SetFault(func(r registry.Request) *registry.Fault {
		if r.Kind == registry.KindBlob && r.Reference == slow {
			return &registry.Fault{BytesPerSecond: 1 << 20}
		}
		return nil
	})
	ctx := context.Background()
	pullErr := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); pullErr <- err }()
	inBefore := img.LayerSizes[0] + img.LayerSizes[1] + img.LayerSizes[2]
	eventually(t, 30*time.Second, "three layers in and the fourth part-way", func() bool {
		p := e.listPulls()
		return len(p) == 1 && p[0].GetBytesDone() > inBefore+copyChunk+256<<10
	})
	e.d.Kill(t)
	if err := <-pullErr; err == nil {
		t.Fatal("the pull succeeded although containerd was killed during it")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := e.upstream.WaitIdle(wctx); err != nil {
		t.Fatal(err)
	}
	before, _ := blobGets(e.upstream)
	for _, l := range img.Layers[:3] {
		if before[l.String()] == 0 {
			t.Fatalf("layer %s was not fetched before the crash: %v", l, before)
		}
	}
	cut := before[slow]
	if cut == 0 || cut >= img.LayerSizes[3] {
		t.Fatalf("the slow layer had %d of %d bytes sent at the crash, want part of it", cut, img.LayerSizes[3])
	}

	e.upstream.SetFault(nil)
	e.upstream.Reset()
	e.restartAfterCrash()
	e.requireNothingStale(img.Ref)

	e.criPull(img.Ref)
	if err := e.upstream.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	after, ranged := blobGets(e.upstream)
	for _, l := range img.Layers[:3] {
		if n := after[l.String()]; n != 0 {
			t.Errorf("layer %s, in before the crash, was fetched again (%d bytes)", l, n)
		}
	}
	t.Logf("slow layer: %d bytes before the crash, %d after (of %d), range request: %v", cut, after[slow], img.LayerSizes[3], ranged[slow])
	if !ranged[slow] || after[slow] > img.LayerSizes[3]-copyChunk {
		t.Errorf("the cut layer was fetched again from %d of %d bytes (range request %v): want it resumed after the first MiB at least", img.LayerSizes[3]-after[slow], img.LayerSizes[3], ranged[slow])
	}
	if total := after[slow] + after[img.Config.String()]; total >= img.LayerBytes() {
		t.Errorf("the pull after the crash fetched %d bytes of %d", total, img.LayerBytes())
	}
	e.assertSource(img.Ref, img, img.Ref)
}

// TestCrashWhilePullsAreQueued: SIGKILL with one pull holding the only
// slot and three queued behind it. After the restart nothing of them is
// listed, and the same pulls succeed, with what was fetched reused.
func TestCrashWhilePullsAreQueued(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	var imgs []registry.Pushed
	for i := range 4 {
		imgs = append(imgs, e.push(fmt.Sprintf("crash/queued%d", i), "v1", registry.Image{Layers: []int64{64 << 10, 64 << 10}, Seed: int64(3100 + i)}))
	}
	// The first image's layers are held: it keeps the slot, with its
	// manifest and config in.
	held := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	e.upstream.SetFault(func(r registry.Request) *registry.Fault {
		if r.Kind == registry.KindBlob && r.Reference != imgs[0].Config.String() && r.Repo == "crash/queued0" {
			<-held
		}
		return nil
	})
	ctx := context.Background()
	errs := make(chan error, len(imgs))
	for i, img := range imgs {
		go func() {
			_, err := e.images.PullImage(ctx, criImage(img.Ref), nil, sandbox(fmt.Sprintf("pod%d", i)))
			errs <- err
		}()
		if i == 0 {
			eventually(t, 10*time.Second, "the first pull holding the slot", func() bool { return e.pullsIn("pulling") == 1 })
		}
	}
	eventually(t, 10*time.Second, "three pulls queued", func() bool { return e.pullsIn("waiting") == 3 })
	// The registry having sent the config is not enough: containerd
	// commits it to its content store a moment later.
	eventually(t, 10*time.Second, "the first image's config committed", func() bool { return e.contentCommitted("k8s.io", imgs[0].Config) })
	e.d.Kill(t)
	release()
	for range imgs {
		if err := <-errs; err == nil {
			t.Fatal("a pull succeeded although containerd was killed during it")
		}
	}
	for i := 1; i < len(imgs); i++ {
		repo := fmt.Sprintf("crash/queued%d", i)
		if n := e.upstream.Count(blobsOf(repo)); n != 0 {
			t.Fatalf("queued %s fetched %d blobs before the crash", repo, n)
		}
	}
	e.upstream.SetFault(nil)
	e.upstream.Reset()
	e.restartAfterCrash()
	var refs []string
	for _, img := range imgs {
		refs = append(refs, img.Ref)
	}
	e.requireNothingStale(refs...)

	var g errgroup.Group
	for i, img := range imgs {
		g.Go(func() error {
			_, err := e.images.PullImage(ctx, criImage(img.Ref), nil, sandbox(fmt.Sprintf("pod%d", i)))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("pull after the crash: %v", err)
	}
	if n := e.upstream.Count(func(r registry.Request) bool { return r.Reference == imgs[0].Config.String() && r.Method == "GET" }); n != 0 {
		t.Errorf("the first image's config, in before the crash, was fetched again (%d GETs)", n)
	}
	for _, img := range imgs {
		e.assertSource(img.Ref, img, img.Ref)
	}
	if p := e.listPulls(); len(p) != 0 {
		t.Fatalf("ListPulls after every pull ended: %v", p)
	}
}

// TestCrashLeavesSnapshotDirectory: SIGKILL between the snapshotter's
// rename of a new snapshot's directory and the commit of its record leaves
// snapshots/<next ID> on disk with nothing in the snapshotter's database,
// which hands that ID out again. The window is a few milliseconds wide, so
// the test writes what such a kill leaves rather than waiting to hit it.
// After the restart the next unpack must not trip on the directory. On a
// fresh root the cut Prepare was the first, and the database has no
// snapshot bucket yet.
func TestCrashLeavesSnapshotDirectory(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pullBefore bool
	}{
		{name: "after a pull", pullBefore: true},
		{name: "on a fresh root"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			if e.d.Snapshotter != "overlayfs" {
				t.Fatalf("containerd runs the %s snapshotter: overlay does not mount under %s, and this test needs overlayfs", e.d.Snapshotter, e.d.Dir)
			}
			next := e.push("crash/snapshot-next", "v1", registry.Image{Layers: []int64{16 << 10, 16 << 10}, Seed: 3301})
			if tc.pullBefore {
				e.criPull(e.push("crash/snapshot-first", "v1", registry.Image{Layers: []int64{16 << 10, 16 << 10}, Seed: 3300}).Ref)
			}
			e.d.Kill(t)

			dir := filepath.Join(e.d.Root, "io.containerd.snapshotter.v1.overlayfs", "snapshots")
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			// IDs come from a sequence, and nothing was removed: the next
			// is one past the highest.
			highest := 0
			for _, de := range entries {
				if id, err := strconv.Atoi(de.Name()); err == nil && id > highest {
					highest = id
				}
			}
			left := []string{
				filepath.Join(dir, strconv.Itoa(highest+1), "fs", "left-by-the-crash"),
				filepath.Join(dir, "new-3300", "fs", "left-by-the-crash"),
			}
			for _, f := range left {
				if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}

			e.restartAfterCrash()
			if _, err := e.images.PullImage(context.Background(), criImage(next.Ref), nil, nil); err != nil {
				t.Fatalf("pull after the crash: %v", err)
			}
			e.assertSource(next.Ref, next, next.Ref)
			for _, f := range left {
				if _, err := os.Stat(f); !os.IsNotExist(err) {
					t.Errorf("%s, left by the crash, is still there (stat: %v)", f, err)
				}
			}
		})
	}
}

// TestCrashDuringPinReconcile: SIGKILL while the pinning reconciler, at
// start after a config change, is writing pin labels. After the restart
// every record config names is pinned and marked, and no other is.
func TestCrashDuringPinReconcile(t *testing.T) {
	p := newPinEnv(t, func(string) envOptions { return envOptions{} })
	const n = 40
	var imgs []registry.Pushed
	for i := range n {
		imgs = append(imgs, p.push(fmt.Sprintf("crash/pin%02d", i), "1", registry.Image{Layers: []int64{4 << 10}, Seed: int64(3200 + i)}))
	}
	var g errgroup.Group
	g.SetLimit(8)
	for _, img := range imgs {
		g.Go(func() error {
			_, err := p.images.PullImage(context.Background(), criImage(img.Ref), nil, nil)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	// One more image, not pinned, which must stay so.
	other := p.push("crash/other", "1", registry.Image{Layers: []int64{4 << 10}, Seed: 3299})
	p.criPull(other.Ref)

	var kv []string
	for i, img := range imgs {
		kv = append(kv, fmt.Sprintf("img%02d", i), img.Ref)
	}
	pinned := pinnedImagesTOML(kv...)
	records := 3 * n // tag, repo digest and ID of each

	// The pass starts when containerd starts; kill it at its first write.
	// A pass that finished before the kill landed proves nothing, so the
	// config goes back and forth until one is cut (on a slow machine the
	// first try does it).
	landed := false
	for attempt := 1; attempt <= 3 && !landed; attempt++ {
		p.setPinnedImages(pinned)
		p.d.Stop(t)
		from := logSize(t, p.d)
		p.d.Respawn(t)
		waitLog(t, p.d, from, `msg="pinned image`)
		p.d.Kill(t)
		got := pinnedRecords(t, p.d)
		t.Logf("attempt %d: %d of %d records pinned at the kill", attempt, got, records)
		landed = got < records
		if !landed {
			p.setPinnedImages("")
			p.d.Restart(t)
			for _, img := range imgs {
				p.requireUnpinned(img, tagRef(img))
			}
		}
	}
	if !landed {
		t.Fatal("every kill came after the reconciler's pass had ended")
	}

	p.restartAfterCrash()
	for _, img := range imgs {
		p.requirePinnedByConfig(img, tagRef(img), repoDigestRef(img), imageID(img))
	}
	p.requireUnpinned(other, tagRef(other), repoDigestRef(other), imageID(other))
	for _, img := range append(imgs, other) {
		p.assertSource(img.Ref, img, img.Ref)
	}
}

// setPinnedImages rewrites the CRI images plugin's pinned_images (TOML from
// pinnedImagesTOML, or none), for the next start.
func (p *pinEnv) setPinnedImages(toml string) {
	p.t.Helper()
	path := filepath.Join(p.d.Dir, "config.toml")
	b, err := os.ReadFile(path)
	if err != nil {
		p.t.Fatal(err)
	}
	const anchor = "  [plugins.\"io.containerd.cri.v1.images\".registry]"
	cfg := string(b)
	if i := strings.Index(cfg, "  [plugins.\"io.containerd.cri.v1.images\".pinned_images]"); i >= 0 {
		cfg = cfg[:i] + cfg[strings.Index(cfg, anchor):]
	}
	cfg = strings.Replace(cfg, anchor, toml+anchor, 1)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		p.t.Fatal(err)
	}
}

func logSize(t *testing.T, d *daemon.Daemon) int64 {
	fi, err := os.Stat(filepath.Join(d.Dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// waitLog waits until containerd's log, from offset on, holds s. It polls
// fast: what it waits for is the moment to kill.
func waitLog(t *testing.T, d *daemon.Daemon, offset int64, s string) {
	t.Helper()
	f, err := os.Open(filepath.Join(d.Dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	deadline := time.Now().Add(60 * time.Second)
	var seen []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := f.ReadAt(buf, offset)
		seen, offset = append(seen, buf[:n]...), offset+int64(n)
		if strings.Contains(string(seen), s) {
			return
		}
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if !d.Running() {
			t.Fatalf("containerd exited before logging %q", s)
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not log %q within 60s", s)
		}
		if n == 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// pinnedRecords counts the k8s.io image records carrying the pin label,
// read from containerd's metadata database while containerd is down: what
// the crash left on disk.
func pinnedRecords(t *testing.T, d *daemon.Daemon) int {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(d.Root, "io.containerd.metadata.v1.bolt", "meta.db"), 0o600, &bbolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("open containerd's metadata: %v", err)
	}
	defer db.Close()
	n := 0
	err = db.View(func(tx *bbolt.Tx) error {
		images := tx.Bucket([]byte("v1")).Bucket([]byte("k8s.io")).Bucket([]byte("images"))
		return images.ForEachBucket(func(name []byte) error {
			if labels := images.Bucket(name).Bucket([]byte("labels")); labels != nil && string(labels.Get([]byte(pinnedLabel))) == "pinned" {
				n++
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
