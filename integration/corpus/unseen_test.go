package corpus

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/types"
)

// someTrees are trees for the scenarios' shapes: none is walked.
var someTrees = Trees{
	GoRoot: "/goroot", Lib: "/lib", Bin: "/bin", GCC: "/gcc", Doc: "/doc", Share: "/share",
	Mod: "/mod", JVM: "/jvm", App: "/app", LLVM: "/llvm", Pause: "/pause",
	Plugins: "/plugins", Include: "/include", Locale: "/locale", Man: "/man", Python: "/python",
}

func TestUnseenShapes(t *testing.T) {
	layers := func(imgs []Image) []int {
		var n []int
		for _, img := range imgs {
			n = append(n, len(img.Layers))
		}
		return n
	}
	t.Run("giant", func(t *testing.T) {
		imgs := Giant(someTrees)
		if len(imgs) != 16 || imgs[0].Name != "big" {
			t.Fatalf("%d images, the first %q: want 16, the first big", len(imgs), imgs[0].Name)
		}
		for _, img := range imgs[1:] {
			if len(img.Layers) != 1 || img.Layers[0][0].Budget > 16*mib {
				t.Errorf("sidecar %s: %d layers, %+v", img.Name, len(img.Layers), img.Layers)
			}
		}
	})
	t.Run("flood", func(t *testing.T) {
		imgs := Flood(someTrees)
		if len(imgs) != 40 {
			t.Fatalf("%d images, want 40", len(imgs))
		}
		for _, n := range layers(imgs) {
			if n != 1 {
				t.Fatalf("layers %v, want one each", layers(imgs))
			}
		}
	})
	t.Run("deep", func(t *testing.T) {
		imgs := Deep(someTrees)
		if len(imgs) != 4 {
			t.Fatalf("%d images, want 4", len(imgs))
		}
		seen := map[string]int{}
		for _, img := range imgs {
			if len(img.Layers) != 60 {
				t.Fatalf("%s: %d layers, want 60", img.Name, len(img.Layers))
			}
			for _, l := range img.Layers {
				desc, _ := json.Marshal(l)
				seen[string(desc)]++
			}
		}
		// Five base layers in all four, the rest each in one.
		shared := 0
		for _, n := range seen {
			switch n {
			case 4:
				shared++
			case 1:
			default:
				t.Fatalf("a layer in %d images", n)
			}
		}
		if shared != 5 || len(seen) != 5+4*55 {
			t.Fatalf("%d layers, %d shared: want %d, 5", len(seen), shared, 5+4*55)
		}
	})
	t.Run("compressions", func(t *testing.T) {
		imgs := Compressions(someTrees)
		if len(imgs) != 6 {
			t.Fatalf("%d images, want 6", len(imgs))
		}
		used := map[Compression]bool{}
		mixed := false
		for _, img := range imgs {
			if len(img.Compression) != len(img.Layers) {
				t.Errorf("%s: %d compressions for %d layers", img.Name, len(img.Compression), len(img.Layers))
			}
			kinds := map[Compression]bool{}
			for i := range img.Layers {
				kinds[img.compressionOf(i)] = true
				used[img.compressionOf(i)] = true
			}
			mixed = mixed || len(kinds) > 1
		}
		for _, c := range []Compression{GzipFast, GzipBest, Zstd} {
			if !used[c] {
				t.Errorf("no layer is %q", c)
			}
		}
		if !mixed {
			t.Error("no image mixes compressions")
		}
	})
}

// TestCompressions: each compression gives its media type, and a digest
// and diffID that are those of the file and of its tar.
func TestCompressions(t *testing.T) {
	dir := tree(t, map[string]int{"a/1": 5000, "b/2": 300})
	comps := []Compression{GzipFast, GzipBest, Zstd, Gzip}
	img := Image{Name: "mixed", Compression: comps[:3]} // the last by default
	for i := range comps {
		img.Layers = append(img.Layers, Layer{{Dir: dir, Into: string(rune('a' + i))}})
	}
	built, err := Build(t.TempDir(), img)
	if err != nil {
		t.Fatal(err)
	}
	m, err := built.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := built.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := built.Layers()
	if err != nil {
		t.Fatal(err)
	}
	want := map[Compression]types.MediaType{
		GzipFast: "application/vnd.oci.image.layer.v1.tar+gzip",
		GzipBest: "application/vnd.oci.image.layer.v1.tar+gzip",
		Gzip:     "application/vnd.oci.image.layer.v1.tar+gzip",
		Zstd:     "application/vnd.oci.image.layer.v1.tar+zstd",
	}
	var sizes []int64
	for i, c := range comps {
		if got := m.Layers[i].MediaType; got != want[c] {
			t.Errorf("layer %d (%q): media type %s, want %s", i, c, got, want[c])
		}
		// The diffID is the tar's, read back through the compression.
		rc, err := layers[i].Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		if _, err := io.Copy(h, rc); err != nil {
			t.Fatalf("layer %d (%q): %v", i, c, err)
		}
		rc.Close()
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != cfg.RootFS.DiffIDs[i].String() {
			t.Errorf("layer %d (%q): tar %s, diffID %s", i, c, got, cfg.RootFS.DiffIDs[i])
		}
		// The digest is the file's as it is, not compressed again.
		rc, err = layers[i].Compressed()
		if err != nil {
			t.Fatal(err)
		}
		h.Reset()
		n, _ := io.Copy(h, rc)
		rc.Close()
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != m.Layers[i].Digest.String() || n != m.Layers[i].Size {
			t.Errorf("layer %d (%q): file %s (%d bytes), manifest %s (%d)", i, c, got, n, m.Layers[i].Digest, m.Layers[i].Size)
		}
		sizes = append(sizes, n)
	}
	// The same tar (but for its names' first letter) is smaller at level 9
	// than at level 1.
	if sizes[1] > sizes[0] {
		t.Errorf("gzip -9 %d bytes, gzip -1 %d", sizes[1], sizes[0])
	}
}

// TestGzipCacheUnchanged: a gzip layer at the default level is cached
// under the name it had before compressions could be chosen, so caches
// and digests built then still serve.
func TestGzipCacheUnchanged(t *testing.T) {
	l := Layer{{Dir: "/nowhere", Into: "x"}}
	desc, err := json.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(desc, runtime.Version()...))
	cache := t.TempDir()
	file, err := cached(cache, l, Gzip)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(cache, hex.EncodeToString(sum[:12])+".tar.gz"); file != want {
		t.Fatalf("gzip layer cached as %s, want %s", file, want)
	}
	for _, c := range []Compression{GzipFast, GzipBest, Zstd} {
		other, err := cached(cache, l, c)
		if err != nil {
			t.Fatal(err)
		}
		if other == file || (c == Zstd) != strings.HasSuffix(other, ".tar.zst") {
			t.Errorf("%q cached as %s", c, other)
		}
	}
}
