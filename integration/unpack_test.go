package integration

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
// files back.
func TestParallelUnpackWhiteouts(t *testing.T) {
	e := newEnv(t, envOptions{logLevel: "debug"}) // "image unpacked" is a debug line
	if e.d.Snapshotter != "overlayfs" {
		// Parallel unpack needs a snapshotter that can rebase; native cannot.
		t.Fatalf("containerd runs the %s snapshotter: overlay does not mount under %s, and this test needs overlayfs", e.d.Snapshotter, e.d.Dir)
	}
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

	line := unpackedLine(e.d.Log(), img.Config)
	if line == "" {
		t.Fatalf("containerd logged no \"image unpacked\" line for config %s", img.Config)
	}
	if !slices.Contains(strings.Fields(line), "parallel=true") {
		t.Errorf("containerd did not unpack in parallel:\n%s", line)
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
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="image unpacked"`) && strings.Contains(line, cfg.String()) {
			return line
		}
	}
	return ""
}
