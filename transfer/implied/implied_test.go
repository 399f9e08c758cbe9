package implied

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/native"
	"golang.org/x/sys/unix"

	"github.com/pullwise/pullwise/transfer/layerdir"
)

func TestHeadersImplied(t *testing.T) {
	dir := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeDir} }
	file := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg} }
	for _, tc := range []struct {
		name    string
		entries []*tar.Header
		want    []string
	}{
		{"every parent listed", []*tar.Header{dir("a"), file("a/x"), dir("a/b"), file("a/b/y")}, nil},
		{"none listed", []*tar.Header{file("a/b/y"), file("c")}, []string{"a", "a/b"}},
		{"listed after its file", []*tar.Header{file("a/x"), dir("a")}, nil},
		{"whiteout", []*tar.Header{file("e/.wh.f")}, []string{"e"}},
		{"opaque marker", []*tar.Header{file("o/.wh..wh..opq"), file("o/n")}, []string{"o"}},
		{"absolute names", []*tar.Header{file("/r/s/t")}, []string{"r", "r/s"}},
		{"root entry", []*tar.Header{dir("."), file("top")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h headers
			for _, hdr := range tc.entries {
				if ok, err := h.record(hdr); !ok || err != nil {
					t.Fatalf("record(%s) = %v, %v; want every entry accepted", hdr.Name, ok, err)
				}
			}
			if got := h.implied(); !slices.Equal(got, tc.want) {
				t.Errorf("implied = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestCommitInheritsImpliedDirs commits, onto a parent of two layers, a
// layer whose implied directories were made 0755 as a parallel unpack makes
// them. It runs on containerd's native snapshotter, which needs no mounts;
// its view of the parent is one directory with both layers merged, where
// overlayfs's lists each layer.
func TestCommitInheritsImpliedDirs(t *testing.T) {
	ctx := context.Background()
	sn, dirs := nativeSnapshotter(t)

	// Layer 1: private p, p/q and s; f is a file.
	layer(t, sn, "l1", "", map[string]os.FileMode{"p": 0o700, "p/q": 0o710, "s": 0o750, "f": 0})
	// Layer 2 on top: p/q re-listed 0711, and s replaced by a file.
	layer(t, sn, "l2", "l1", map[string]os.FileMode{"p/q": 0o711, "s": 0})

	// Layer 3, applied alone: p, p/q, s, n and f/... implied, all 0755.
	upper := prepare(t, sn, "active", "")
	for _, d := range []string{"p/q", "s", "n"} {
		if err := os.MkdirAll(filepath.Join(upper, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dirs.put(upper, []string{"n", "p", "p/q", "s"})
	if err := sn.Commit(ctx, "l3", "active", snapshots.WithParent("l2")); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{
		"p":   0o700, // layer 1's; layer 2 does not change it
		"p/q": 0o711, // layer 2's, not layer 1's
		"s":   0o755, // a file in layer 2 hides layer 1's directory
		"n":   0o755, // in no layer below
	} {
		fi, err := os.Lstat(filepath.Join(upper, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s is %v after commit, want %v", name, got, want)
		}
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(upper, "p"), "user.layer", buf); err != nil || string(buf[:n]) != "l1" {
		t.Errorf("p's user.layer after commit: %q, %v; want l1's", buf[:max(n, 0)], err)
	}
	if dirs.len() != 0 {
		t.Errorf("%d layers still recorded after their commit", dirs.len())
	}
	// No view is left behind.
	var keys []string
	if err := sn.Walk(ctx, func(_ context.Context, i snapshots.Info) error { keys = append(keys, i.Name); return nil }); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	if want := []string{"l1", "l2", "l3"}; !slices.Equal(keys, want) {
		t.Errorf("snapshots after commit: %q, want %q", keys, want)
	}
}

// TestRemoveForgetsImpliedDirs: an unpack that fails after its apply
// removes the active snapshot instead of committing it, and what was
// recorded for it must go with it, or a node leaks an entry per failure.
func TestRemoveForgetsImpliedDirs(t *testing.T) {
	sn, dirs := nativeSnapshotter(t)
	dirs.put(prepare(t, sn, "active", ""), []string{"d"})
	if err := sn.Remove(context.Background(), "active"); err != nil {
		t.Fatal(err)
	}
	if dirs.len() != 0 {
		t.Errorf("%d layers still recorded after their snapshot was removed", dirs.len())
	}
}

func nativeSnapshotter(t *testing.T) (Snapshotter, *Dirs) {
	t.Helper()
	inner, err := native.NewSnapshotter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dirs := NewDirs()
	return Snapshotter{Snapshotter: inner, Dirs: dirs}, dirs
}

// prepare prepares an active snapshot and returns its directory.
func prepare(t *testing.T, sn snapshots.Snapshotter, key, parent string) string {
	t.Helper()
	mounts, err := sn.Prepare(context.Background(), key, parent)
	if err != nil {
		t.Fatal(err)
	}
	dir, ok := layerdir.BindSource(mounts)
	if !ok {
		t.Fatalf("active snapshot %s mounts as %v, want one bind mount", key, mounts)
	}
	return dir
}

// layer commits a snapshot named name on parent, with directories of the
// given modes (0: a file).
func layer(t *testing.T, sn snapshots.Snapshotter, name, parent string, entries map[string]os.FileMode) {
	t.Helper()
	root := prepare(t, sn, name+"-active", parent)
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		p := filepath.Join(root, n)
		if err := os.RemoveAll(p); err != nil {
			t.Fatal(err)
		}
		if entries[n] == 0 {
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, entries[n]); err != nil {
			t.Fatal(err)
		}
		if err := unix.Lsetxattr(p, "user.layer", []byte(name), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := sn.Commit(context.Background(), name, name+"-active"); err != nil {
		t.Fatal(err)
	}
}
