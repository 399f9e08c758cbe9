package corpus

import "fmt"

// The unseen corpus: shapes the scheduler was not tuned on, each made to
// break a smallest-first heuristic, from trees (or parts of trees) the
// first corpus (NodeBoot, DeployBurst, BigAndSmall) does not take.

// offsets hands out the parts of trees a scenario takes, one after the
// other, so that no two layers hold the same files.
type offsets map[string]int64

// take is the next budget bytes of dir, into into.
func (o offsets) take(dir, into string, budget int64) Source {
	s := Source{Dir: dir, Into: into, Skip: o[dir], Budget: budget}
	o[dir] += budget
	return s
}

// Giant is one image of about 1 GiB on the wire, asked for first, whose
// largest layer is about 700 MiB (huge binaries, module zips that do not
// compress, and shared libraries, in one layer, as a model image's
// weights are), beside 15 sidecar images of 1 to 3 MiB. The first image is
// the giant, named "big" as BigAndSmall's is.
func Giant(t Trees) []Image {
	big := Image{Name: "big", Layers: []Layer{
		{{Dir: t.Python, Into: "usr/lib/python3"}},
		{
			{Dir: t.Plugins, Into: "opt/plugins"},
			{Dir: t.Mod + "/cache/download", Into: "opt/model"},
			{Dir: t.Lib, Into: "opt/model/lib", Budget: 650 * mib},
		},
		{{Dir: t.JVM, Into: "opt/jre", Budget: 200 * mib}},
		{{Dir: t.App, Into: "opt/sdk", Budget: 500 * mib}},
	}}
	imgs := []Image{big}
	// Past what the first corpus takes of the binaries and past their
	// large files (on Debian: node and perf), as a large file would make a
	// sidecar tens of MiB; then headers.
	o := offsets{t.Bin: 147 * mib}
	for i := range 15 {
		dir, into, ratio := t.Bin, "usr/local/bin", int64(5) // ratio: how much it compresses, times two
		if i >= 10 {
			dir, into, ratio = t.Include, "usr/include", 9
		}
		wire := int64(1 + i%3) // MiB
		imgs = append(imgs, Image{Name: fmt.Sprintf("sidecar%02d", i), Layers: []Layer{{o.take(dir, into, wire*ratio*mib/2)}}})
	}
	return imgs
}

// Flood is a burst of 40 images of 1 to 5 MiB, each one layer of its own,
// from five trees that compress differently.
func Flood(t Trees) []Image {
	type tree struct {
		dir string
		// ratio is about how much the tree compresses, times two.
		ratio int64
	}
	// The catalogs twice: the libraries have files too large for images
	// this small.
	trees := []tree{{t.Include, 9}, {t.Locale, 4}, {t.Man, 2}, {t.App, 6}, {t.Locale, 4}}
	// Past Giant's part of the SDK.
	o := offsets{t.App: 1 << 30}
	var imgs []Image
	for i := range 40 {
		tr := trees[i%len(trees)]
		wire := int64(1 + (i+i/5)%5) // MiB: 1 to 5, in no order
		s := o.take(tr.dir, "app", wire*tr.ratio*mib/2)
		imgs = append(imgs, Image{Name: fmt.Sprintf("flood%02d", i), Layers: []Layer{{s}}})
	}
	return imgs
}

// Deep is four images of 60 small layers each, 96 KiB to 1.5 MiB before
// compression: the first five, a base, shared by all four.
func Deep(t Trees) []Image {
	o := offsets{}
	var base []Layer
	for j := range 5 {
		base = append(base, Layer{o.take(t.Python, fmt.Sprintf("base/%02d", j), int64(1+j%3)*mib/2)})
	}
	// The larger trees twice as often.
	trees := []string{t.Include, t.Locale, t.Python, t.Man, t.Include, t.Locale}
	var imgs []Image
	for i := range 4 {
		img := Image{Name: fmt.Sprintf("deep%d", i), Layers: append([]Layer(nil), base...)}
		for j := 5; j < 60; j++ {
			budget := int64((j*7+i*3)%16+1) * 96 << 10
			img.Layers = append(img.Layers, Layer{o.take(trees[(i+j)%len(trees)], fmt.Sprintf("layer/%02d", j), budget)})
		}
		imgs = append(imgs, img)
	}
	return imgs
}

// Compressions is six images of 20 to 60 MiB whose layers are gzipped at
// level 1, at level 9, at the default level, or zstd-compressed; two mix
// them.
func Compressions(t Trees) []Image {
	// Sources that compress, so that the compressions differ: modules'
	// past the zips and test data at the start of the module cache (and
	// what the first corpus takes), with Python's from the SDK's library.
	o := offsets{t.Mod: 665 * mib, t.App: 762 * mib}
	layers := func(budgets ...int64) []Layer {
		var ls []Layer
		for _, b := range budgets {
			ls = append(ls, Layer{o.take(t.Mod, "opt/app/mod", b*mib), o.take(t.App, "opt/app/py", b*2/3*mib)})
		}
		return ls
	}
	return []Image{
		{Name: "gzip1", Layers: layers(50, 30), Compression: []Compression{GzipFast, GzipFast}},
		{Name: "gzip9", Layers: layers(50, 30), Compression: []Compression{GzipBest, GzipBest}},
		{Name: "zstd", Layers: layers(50, 30), Compression: []Compression{Zstd, Zstd}},
		{Name: "zstd-big", Layers: layers(140), Compression: []Compression{Zstd}},
		{Name: "mixed", Layers: layers(40, 40, 40), Compression: []Compression{GzipFast, GzipBest, Zstd}},
		{Name: "gzip-zstd", Layers: layers(70, 70), Compression: []Compression{Gzip, Zstd}},
	}
}
