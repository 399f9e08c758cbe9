package integration

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"

	"github.com/pullwise/pullwise/integration/registry"
)

// TestParallelUnpackWhiteouts pulls through CRI an image whose later layers
// delete files, hide a directory and add files, and checks the root
// filesystem containerd unpacked. With parallel unpack each layer is applied
// without its parents and rebased after, so a whiteout applied as a plain
// deletion (of nothing) instead of an overlay whiteout would bring deleted
// files back. max_concurrent_unpacks is set to 2 rather than left at its
// default (one per CPU), so the test unpacks in parallel on any machine.
func TestParallelUnpackWhiteouts(t *testing.T) {
	// "image unpacked" is a debug line.
	e := newEnv(t, envOptions{logLevel: "debug", transfer: "  max_concurrent_unpacks = 2"})
	requireOverlayfs(t, e)
	img := e.push("unpack/whiteouts", "v1", registry.Image{FileLayers: []map[string][]byte{
		{"/a/x": []byte("x1"), "/a/y": []byte("y1"), "/b/z": []byte("z1"), "/keep": []byte("keep1")},
		{"/a/x": nil},
		{"/b/": nil, "/b/new": []byte("new3")},
		{"/a/x2": []byte("x4"), "/keep": nil},
	}})
	e.criPull(img.Ref)

	root, chainID := e.mountImage("k8s.io", img.Ref, "overlayfs")
	want := map[string]string{
		"a/": "", "a/y": "y1", "a/x2": "x4",
		"b/": "", "b/new": "new3",
	}
	if got := rootTree(t, root); !maps.Equal(got, want) {
		t.Errorf("unpacked root filesystem:\n%v\nwant:\n%v", got, want)
	}

	assertUnpacked(t, e, img.Config, chainID, true)
}

// TestUnpackKeepsImpliedDirectories pulls through CRI an image whose upper
// layers add files to, and delete files from, directories they have no
// entries for, as some image builders write layers. Every such directory
// must keep the mode and owner the layers below gave it, and one nothing
// below has gets 0755 and root, as containerd's sequential unpack does.
// containerd v2.4.2's parallel unpack applies each layer alone and creates
// them all 0755 and owned by root, so a private directory would become
// world-readable; Pullwise's parallel unpack mends them as it commits each
// layer (transfer/implied). The third layer implies directories that only
// the first has, and one that the second implies too.
func TestUnpackKeepsImpliedDirectories(t *testing.T) {
	for _, tc := range []struct {
		name     string
		transfer string
		parallel bool
	}{
		{name: "sequential", transfer: "  max_concurrent_unpacks = 1"},
		// One per CPU: parallel wherever there is more than one.
		{name: "default", parallel: runtime.NumCPU() > 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{logLevel: "debug", transfer: tc.transfer}) // "image unpacked" is a debug line
			requireOverlayfs(t, e)
			img := e.push("unpack/implied-dirs", "v1", registry.Image{
				FileLayers: []map[string][]byte{
					{"/d/f": []byte("f1"), "/d/h": []byte("h1"), "/e/f": []byte("ef1"), "/e/k": []byte("k1"), "/n/m/f": []byte("nf1")},
					{"/d/g": []byte("g2"), "/e/f": nil, "/new/x": []byte("x2")},
					{"/d/i": []byte("i3"), "/n/m/z": []byte("z3")},
				},
				FileLayerDirs: []map[string]registry.Dir{{
					"d":   {Mode: 0o700, UID: 1000, GID: 1000},
					"e":   {Mode: 0o750, UID: 1001, GID: 1001},
					"n":   {Mode: 0o711, UID: 1002, GID: 1002},
					"n/m": {Mode: 0o700, UID: 1003, GID: 1003},
				}},
				// Only the first layer has directory entries, and only
				// for the directories listed here.
				ImpliedDirs: true,
			})
			e.criPull(img.Ref)

			root, chainID := e.mountImage("k8s.io", img.Ref, "overlayfs")
			wantTree := map[string]string{
				"d/": "", "d/f": "f1", "d/g": "g2", "d/h": "h1", "d/i": "i3",
				"e/": "", "e/k": "k1",
				"n/": "", "n/m/": "", "n/m/f": "nf1", "n/m/z": "z3",
				"new/": "", "new/x": "x2",
			}
			if got := rootTree(t, root); !maps.Equal(got, wantTree) {
				t.Errorf("unpacked root filesystem:\n%v\nwant:\n%v", got, wantTree)
			}
			type owned struct {
				mode     fs.FileMode
				uid, gid uint32
			}
			for _, want := range []struct {
				name string
				owned
			}{
				{"d", owned{fs.ModeDir | 0o700, 1000, 1000}},
				{"e", owned{fs.ModeDir | 0o750, 1001, 1001}},
				{"n", owned{fs.ModeDir | 0o711, 1002, 1002}},
				{"n/m", owned{fs.ModeDir | 0o700, 1003, 1003}},
				{"new", owned{fs.ModeDir | 0o755, 0, 0}},
			} {
				fi, err := os.Lstat(filepath.Join(root, want.name))
				if err != nil {
					t.Errorf("/%s: %v", want.name, err)
					continue
				}
				st := fi.Sys().(*syscall.Stat_t)
				if got := (owned{fi.Mode(), st.Uid, st.Gid}); got != want.owned {
					t.Errorf("/%s is %v owned by %d:%d, want %v owned by %d:%d",
						want.name, got.mode, got.uid, got.gid, want.mode, want.uid, want.gid)
				}
			}

			assertUnpacked(t, e, img.Config, chainID, tc.parallel)
			// Each layer's debug line names its pull, so that in a burst
			// an operator can tell whose layers held the unpack places.
			log := e.d.Log()
			n := 0
			for line := range strings.Lines(log) {
				if strings.Contains(line, `msg="layer unpacked in its lane"`) && strings.Contains(line, ` image="`+img.Ref+`"`) {
					n++
				}
			}
			if n != 3 {
				t.Errorf("%d layer lines name %s, want one per layer (3)", n, img.Ref)
			}
			// And the operator is told so at start, at info level; and
			// that work gives way to pulls ahead under CPU pressure
			// wherever the kernel keeps it.
			_, err := os.Stat("/proc/pressure/cpu")
			line := strings.Fields(logLine(log, `msg="unpack configured"`))
			for _, want := range []string{fmt.Sprintf("parallel=%t", tc.parallel), fmt.Sprintf("cpu_pressure=%t", err == nil)} {
				if !slices.Contains(line, want) {
					t.Errorf("containerd's start line does not say %s:\n%s", want, strings.Join(line, " "))
				}
			}
		})
	}
}

// requireOverlayfs stops a test whose containerd cannot run overlayfs:
// parallel unpack, which these tests are about, needs a snapshotter that
// can rebase, and native cannot.
func requireOverlayfs(t *testing.T, e *env) {
	t.Helper()
	if e.d.Snapshotter != "overlayfs" {
		t.Fatalf("containerd runs the %s snapshotter: overlay does not mount under %s, and this test needs overlayfs", e.d.Snapshotter, e.d.Dir)
	}
}

// assertUnpacked checks containerd's "image unpacked" line for the image
// with config cfg: it names the image's chain and says whether the layers
// were unpacked in parallel.
func assertUnpacked(t *testing.T, e *env, cfg, chainID digest.Digest, parallel bool) {
	t.Helper()
	line := unpackedLine(e.d.Log(), cfg)
	if line == "" {
		t.Fatalf("containerd logged no \"image unpacked\" line for config %s", cfg)
	}
	if want := fmt.Sprintf("parallel=%t", parallel); !slices.Contains(strings.Fields(line), want) {
		t.Errorf("containerd's unpack line does not say %s:\n%s", want, line)
	}
	if !strings.Contains(line, chainID.String()) {
		t.Errorf("containerd unpacked another chain than the image's %s:\n%s", chainID, line)
	}
}

// mountImage mounts a read-only view of image ref's root filesystem from
// snapshotter, through containerd's own client as ctr would, and returns
// the mount point and the image's chain ID. Unmounted when the test ends.
func (e *env) mountImage(ns, ref, snapshotter string) (string, digest.Digest) {
	e.t.Helper()
	c, err := client.New(e.d.Socket, client.WithDefaultNamespace(ns))
	if err != nil {
		e.t.Fatalf("connect containerd client: %v", err)
	}
	e.t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	img, err := c.GetImage(ctx, ref)
	if err != nil {
		e.t.Fatalf("get image %s: %v", ref, err)
	}
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		e.t.Fatalf("diff IDs of %s: %v", ref, err)
	}
	chainID := identity.ChainID(diffIDs)

	// A snapshot outside a lease is garbage to containerd's GC, which the
	// end of the pull's own lease may have just scheduled: hold one, as ctr
	// does, so the view lives until the test removes it.
	ctx, done, err := c.WithLease(ctx)
	if err != nil {
		e.t.Fatalf("lease for the view of %s: %v", ref, err)
	}
	e.t.Cleanup(func() {
		if err := done(context.Background()); err != nil {
			e.t.Errorf("end the view's lease: %v", err)
		}
	})
	sn := c.SnapshotService(snapshotter)
	key := "unpack-test-view-" + chainID.Encoded()
	mounts, err := sn.View(ctx, key, chainID.String())
	if err != nil {
		e.t.Fatalf("view snapshot %s on %s: %v", chainID, snapshotter, err)
	}
	e.t.Cleanup(func() {
		if err := sn.Remove(ctx, key); err != nil {
			e.t.Errorf("remove view %s: %v", key, err)
		}
	})
	dir := e.t.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		e.t.Fatalf("mount view of %s: %v", chainID, err)
	}
	e.t.Cleanup(func() {
		if err := mount.UnmountAll(dir, 0); err != nil {
			e.t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir, chainID
}

// assertRootTree checks what a user sees under root (rootTree) against
// want, and names each entry that differs, its content cut short.
func assertRootTree(t *testing.T, root string, want map[string]string) {
	t.Helper()
	got := rootTree(t, root)
	if maps.Equal(got, want) {
		return
	}
	t.Errorf("unpacked root filesystem has %d entries, want %v", len(got), slices.Sorted(maps.Keys(want)))
	for k, v := range got {
		if want[k] != v {
			t.Errorf("  %s: %.40q", k, v)
		}
	}
}

// rootTree lists what a user sees under root: directories with a trailing
// slash, regular files with their content and anything else by its type,
// so that a whiteout showing through as a device or a .wh. file counts.
func rootTree(t *testing.T, root string) map[string]string {
	t.Helper()
	tree := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			tree[rel+"/"] = ""
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			tree[rel] = string(b)
		default:
			tree[rel] = fmt.Sprintf("<%s>", d.Type())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return tree
}

// unpackedLine is containerd's debug line for the unpack of the image with
// config cfg, or "" if it logged none.
func unpackedLine(log string, cfg digest.Digest) string {
	return logLine(log, `msg="image unpacked"`, cfg.String())
}

// TestGzipReadAhead pulls through CRI an image of two gzip layers with an
// igzip on containerd's PATH that logs each call, and checks the unpacked
// files both ways of the transfer key gzip_read_ahead: on (the default),
// Pullwise inflates the layers and containerd never runs igzip; off,
// containerd does as upstream, once per layer.
// appLayers are a small image's layers: an app and its config, then the
// config changed. appTree is its root filesystem.
var (
	appLayers = []map[string][]byte{
		{"/etc/app.conf": []byte("level=1\n"), "/bin/app": []byte(strings.Repeat("app ", 1<<16))},
		{"/etc/app.conf": []byte("level=2\n")},
	}
	appTree = map[string]string{
		"etc/": "", "etc/app.conf": "level=2\n",
		"bin/": "", "bin/app": strings.Repeat("app ", 1<<16),
	}
)

// TestUncompressedLayers pulls through CRI an image of plain tar layers,
// which Pullwise's layer reader passes through so that their writing can
// give way to pulls ahead (transfer/gunzip), and checks the root
// filesystem containerd unpacked, in parallel and one layer at a time.
func TestUncompressedLayers(t *testing.T) {
	for _, unpacks := range []int{1, 2} {
		t.Run(fmt.Sprintf("max_concurrent_unpacks=%d", unpacks), func(t *testing.T) {
			e := newEnv(t, envOptions{transfer: fmt.Sprintf("  max_concurrent_unpacks = %d", unpacks)})
			img := e.push("unpack/tar", "v1", registry.Image{UncompressedFileLayers: true, FileLayers: appLayers})
			e.criPull(img.Ref)

			root, _ := e.mountImage("k8s.io", img.Ref, e.d.Snapshotter)
			assertRootTree(t, root, appTree)
		})
	}
}

func TestGzipReadAhead(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transfer  string
		wantCalls int
	}{
		{"default", "", 0},
		{"off", "  gzip_read_ahead = false", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := t.TempDir()
			calls := filepath.Join(t.TempDir(), "igzip-calls")
			script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\nexec gzip \"$@\"\n", calls)
			if err := os.WriteFile(filepath.Join(bin, "igzip"), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			// containerd inherits the test's environment.
			t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
			e := newEnv(t, envOptions{transfer: tc.transfer})
			img := e.push("unpack/gzip", "v1", registry.Image{FileLayers: appLayers})
			e.criPull(img.Ref)

			root, _ := e.mountImage("k8s.io", img.Ref, e.d.Snapshotter)
			assertRootTree(t, root, appTree)
			b, err := os.ReadFile(calls)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			if got := strings.Count(string(b), "\n"); got != tc.wantCalls {
				t.Errorf("containerd ran igzip %d times, want %d:\n%s", got, tc.wantCalls, b)
			}
		})
	}
}
