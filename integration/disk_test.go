package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// smallDisk mounts a fresh ext4 filesystem of size bytes (no blocks kept
// for root, so df and the pull gate see the same free space) and returns
// a directory on it.
func smallDisk(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(size)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{{"mkfs.ext4", "-q", "-m", "0", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
		}
	}
	// After containerd stops: its snapshots' mounts, then the disk.
	t.Cleanup(func() { daemon.UnmountUnder(t, mnt) })
	return filepath.Join(mnt, "root")
}

// TestDiskPressure: containerd's root on a 350 MiB filesystem, six images
// of 70 MiB (two incompressible 35 MiB layers each) pulled at once through
// CRI, with downloads at 10 MiB/s (so the disk fills as they go) and at
// loopback's pace. As many pulls
// as fit finish; every other one fails with ResourceExhausted naming the
// disk, never Unknown; a pull waiting for space shows in ListPulls and
// finishes once an image is removed; nothing is left half-written, and the
// daemon restarts clean.
func TestDiskPressure(t *testing.T) {
	t.Run("throttled", func(t *testing.T) { testDiskPressure(t, 10<<20) })
	t.Run("unthrottled", func(t *testing.T) { testDiskPressure(t, 0) })
}

func testDiskPressure(t *testing.T, bps int64) {
	root := smallDisk(t, 350<<20)
	e := newRegistriesOnly(t)
	var imgs []registry.Pushed
	for i := range 6 {
		imgs = append(imgs, e.push(fmt.Sprintf("disk/app%d", i), "v1", registry.Image{Layers: []int64{35 << 20, 35 << 20}, Seed: int64(7500 + i)}))
	}
	if bps > 0 {
		throttleBlobs(e.upstream, bps)
	}
	opts := daemon.Options{HostsDir: e.hostsDir, Root: root, ExtraConfig: "[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  pull_queue_timeout = \"20s\"\n"}
	e.d = daemon.Start(t, opts)
	e.connect()

	ctx := context.Background()
	errs := make([]error, len(imgs))
	var wg sync.WaitGroup
	for i, img := range imgs {
		wg.Go(func() { _, errs[i] = e.images.PullImage(ctx, criImage(img.Ref), nil, nil) })
	}
	wg.Wait()
	var pulled, failed []int
	for i, err := range errs {
		switch {
		case err == nil:
			pulled = append(pulled, i)
		case code(err) == "ResourceExhausted" && strings.Contains(err.Error(), "not enough disk space") && strings.Contains(err.Error(), root):
			if strings.Count(err.Error(), "not enough disk space") != 1 || strings.Contains(err.Error(), "\n") {
				t.Errorf("pull %d: said more than once: %q", i, err)
			}
			failed = append(failed, i)
		default:
			t.Errorf("pull %d: %v (%s), want success or ResourceExhausted naming the disk", i, err, code(err))
		}
	}
	t.Logf("pulled %v, out of space %v", pulled, failed)
	if len(pulled) < 2 || len(failed) == 0 {
		t.Fatalf("%d of 6 pulls finished, want at least 2 (as many as fit), and the rest out of space", len(pulled))
	}
	if got := e.metric(`pullwise_pulls_total{outcome="disk_full"}`); got != float64(len(failed)) {
		t.Errorf(`pullwise_pulls_total{outcome="disk_full"} = %v, want %d`, got, len(failed))
	}
	if got := e.metric(`pullwise_disk_free_bytes{filesystem="content"}`); got <= 0 || got > 350<<20 {
		t.Errorf("pullwise_disk_free_bytes of the content store = %v", got)
	}
	assertNoIngest(t, root)
	var refused []string
	for _, i := range failed {
		refused = append(refused, imgs[i].Ref)
	}
	e.requireNothingStale(refused...)
	if out, err := e.ctr("k8s.io", "snapshots", "ls"); err != nil || strings.Contains(out, "Active") {
		t.Fatalf("snapshots left being written (%v):\n%s", err, out)
	}

	// A pull that does not fit waits for space; removing an image makes
	// room, and it finishes.
	retry := imgs[failed[0]]
	done := make(chan error, 1)
	go func() { _, err := e.images.PullImage(ctx, criImage(retry.Ref), nil, nil); done <- err }()
	eventually(t, 10*time.Second, "the pull waiting for space in ListPulls", func() bool { return e.pullsIn("waiting-for-space") == 1 })
	if err := e.images.RemoveImage(ctx, criImage(imgs[pulled[0]].Ref)); err != nil {
		t.Fatalf("RemoveImage: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the waiting pull after an image was removed: %v", err)
	}

	// A restart finds every image whole.
	e.d.Restart(t)
	e.connect()
	for _, i := range append(pulled[1:], failed[0]) {
		st, err := e.images.ImageStatus(ctx, criImage(imgs[i].Ref), false)
		if err != nil || st.GetImage() == nil {
			t.Fatalf("image %s after a restart: %v", imgs[i].Ref, err)
		}
	}
	assertNoIngest(t, root)
}

// assertNoIngest fails when a download was left half-written in the
// content store.
func assertNoIngest(t *testing.T, root string) {
	t.Helper()
	ingest, err := os.ReadDir(filepath.Join(root, "io.containerd.content.v1.content", "ingest"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if len(ingest) > 0 {
		t.Fatalf("%d downloads left in the content store's ingest", len(ingest))
	}
}
