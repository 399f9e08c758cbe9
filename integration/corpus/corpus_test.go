package corpus

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// tree writes files (path: size) under a new directory.
func tree(t *testing.T, files map[string]int) string {
	t.Helper()
	dir := t.TempDir()
	for p, n := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// entries lists the layer file's tar entries, failing on one that is not
// root's or not dated at epoch.
func entries(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: owner %d:%d, time %s", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		names = append(names, h.Name)
	}
}

func TestLayer(t *testing.T) {
	dir := tree(t, map[string]int{"b/2": 10, "a/1": 10, "a/3": 10, "c": 10})
	for _, tc := range []struct {
		name string
		src  Source
		want []string
	}{
		{"all, sorted, with parents", Source{Dir: dir, Into: "usr"},
			[]string{"usr/", "usr/a/", "usr/a/1", "usr/a/3", "usr/b/", "usr/b/2", "usr/c"}},
		{"budget", Source{Dir: dir, Budget: 20}, []string{"a/", "a/1", "a/3"}},
		{"skip, then budget", Source{Dir: dir, Skip: 10, Budget: 20}, []string{"a/", "a/3", "b/", "b/2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			file, err := cached(cache, Layer{tc.src}, Gzip)
			if err != nil {
				t.Fatal(err)
			}
			if got := entries(t, file); !slices.Equal(got, tc.want) {
				t.Fatalf("entries %q, want %q", got, tc.want)
			}
		})
	}
}

// TestBuildIsStable: the same sources give the same image digest, built
// afresh into another cache.
func TestBuildIsStable(t *testing.T) {
	dir := tree(t, map[string]int{"lib/x": 4096, "bin/y": 100})
	img := Image{Name: "app", Layers: []Layer{{{Dir: dir + "/lib", Into: "usr/lib"}}, {{Dir: dir + "/bin", Into: "bin"}}}}
	var digests []string
	for range 2 {
		i, err := Build(t.TempDir(), img)
		if err != nil {
			t.Fatal(err)
		}
		d, err := i.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Fatalf("two builds of one image: %s and %s", digests[0], digests[1])
	}
}

func TestSummary(t *testing.T) {
	for _, tc := range []struct {
		name string
		imgs []Built
		want string
	}{
		{"none", nil, "no images"},
		{"the largest named", []Built{
			{Name: "small", Layers: map[string]int64{"a": 1 << 20}, Bytes: 1 << 20},
			{Name: "big", Layers: map[string]int64{"b": 3 << 20, "c": 5 << 20}, Bytes: 8 << 20},
		}, "2 images, 9 MiB in 3 layers; the largest big, 8 MiB in 2 layers, the largest 5 MiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Summary(tc.imgs); got != tc.want {
				t.Errorf("Summary = %q, want %q", got, tc.want)
			}
		})
	}
}
