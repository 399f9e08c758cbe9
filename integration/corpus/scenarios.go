package corpus

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Trees are the file trees on this machine the corpus is made of.
type Trees struct {
	GoRoot string // the Go toolchain: binaries and many small source files
	Lib    string // shared libraries, such as /usr/lib/x86_64-linux-gnu
	Bin    string // binaries, such as /usr/bin
	GCC    string // the compiler's libraries, such as /usr/lib/gcc
	Doc    string // documentation, many small text files
	Share  string // architecture-independent data, such as /usr/share
	Mod    string // the Go module cache: sources and zips, which do not compress
	JVM    string // a second language runtime
	App    string // a large application tree: an SDK with its own Python, libraries and binaries
	LLVM   string // a compiler's libraries, as CUDA-like native libraries
	Pause  string // a directory holding only the pause binary

	// Trees the first corpus does not use, for the unseen one.
	Plugins string // a few huge binaries, such as Terraform's providers
	Include string // C headers: many small text files
	Locale  string // message catalogs: many small files
	Man     string // manual pages, compressed already
	Python  string // a language's standard library
}

// LocalTrees finds the trees on a Debian machine with Go; pause is the
// directory of the pause binary.
func LocalTrees(pause string) (Trees, error) {
	goEnv := func(name string) (string, error) {
		out, err := exec.Command("go", "env", name).Output()
		return strings.TrimSpace(string(out)), err
	}
	goroot, err := goEnv("GOROOT")
	if err != nil {
		return Trees{}, err
	}
	mod, err := goEnv("GOMODCACHE")
	if err != nil {
		return Trees{}, err
	}
	jvm := "/usr/lib/jvm"
	if _, err := os.Stat(jvm); err != nil {
		jvm = "/usr/lib" // any large tree of libraries
	}
	app := "/usr/lib/google-cloud-sdk"
	if _, err := os.Stat(app); err != nil {
		app = "/usr/lib" // any large tree
	}
	llvm := "/usr/lib/llvm-14"
	if _, err := os.Stat(llvm); err != nil {
		llvm = "/usr/lib/gcc"
	}
	// The first of dirs on this machine.
	first := func(dirs ...string) string {
		for _, d := range dirs[:len(dirs)-1] {
			if _, err := os.Stat(d); err == nil {
				return d
			}
		}
		return dirs[len(dirs)-1]
	}
	return Trees{
		GoRoot: goroot,
		LLVM:   llvm,
		App:    app,
		Share:  "/usr/share",
		Mod:    mod,
		JVM:    jvm,
		Lib:    "/usr/lib/x86_64-linux-gnu",
		Bin:    "/usr/bin",
		GCC:    "/usr/lib/gcc",
		Doc:    "/usr/share/doc",
		Pause:  pause,

		Plugins: first("/opt/tf-plugins", "/usr/bin"),
		Include: first("/usr/include", "/usr/share"),
		Locale:  first("/usr/share/locale", "/usr/share"),
		Man:     first("/usr/share/man", "/usr/share"),
		Python:  first("/usr/lib/python3.11", "/usr/lib/python3", "/usr/share"),
	}, nil
}

const mib = 1 << 20

// NodeBoot is what a node pulls as it boots: the pause image and six
// system images (a proxy, DNS, a CSI node plugin, CNI plugins, a metrics
// agent, a log shipper) of 10 to 40 MiB, sharing one base layer of
// libraries.
func NodeBoot(t Trees) []Image {
	base := Layer{{Dir: t.Lib, Into: "usr/lib", Budget: 20 * mib}}
	return []Image{
		{Name: "pause", Layers: []Layer{{{Dir: t.Pause}}}},
		{Name: "proxy", Layers: []Layer{base, {{Dir: t.GoRoot + "/pkg/tool", Into: "usr/local/bin", Budget: 24 * mib}}}},
		{Name: "dns", Layers: []Layer{base,
			{{Dir: t.GoRoot + "/bin", Into: "usr/local/bin"}},
			{{Dir: t.GoRoot + "/src", Into: "etc/dns", Budget: 16 * mib}}}},
		{Name: "csi-node", Layers: []Layer{base, {{Dir: t.Bin, Into: "usr/bin", Budget: 40 * mib}}}},
		{Name: "cni", Layers: []Layer{base, {{Dir: t.GCC, Into: "opt/cni", Budget: 30 * mib}}}},
		{Name: "metrics", Layers: []Layer{base,
			{{Dir: t.Doc, Into: "usr/share/doc", Budget: 24 * mib}},
			{{Dir: t.GoRoot + "/src", Into: "app", Skip: 16 * mib, Budget: 24 * mib}}}},
		{Name: "logs", Layers: []Layer{base, {{Dir: t.Lib, Into: "usr/lib", Skip: 20 * mib, Budget: 60 * mib}}}},
	}
}

// DeployBurst is a deployment landing on a node: 12 application images of
// about 50 to 200 MiB, each of 6 to 12 layers. They share a distribution
// base, one of two language runtimes and, for some, a tools layer; each
// has four layers of its own (libraries, dependencies, assets, config),
// and every third a few more small ones.
func DeployBurst(t Trees) []Image {
	distro := Layer{{Dir: t.Lib, Into: "usr/lib", Budget: 40 * mib}}
	runtimes := []Layer{
		{{Dir: t.GoRoot + "/pkg/tool", Into: "usr/local/go/pkg/tool"}, {Dir: t.GoRoot + "/bin", Into: "usr/local/go/bin"}},
		{{Dir: t.JVM, Into: "usr/lib/jvm", Budget: 80 * mib}},
	}
	tools := Layer{{Dir: t.Bin, Into: "usr/bin", Budget: 30 * mib}}
	// Where each tree's next unique layer starts, past what the shared
	// layers and the images before took from it.
	next := map[string]int64{t.Lib: 40 * mib, t.Mod: 0, t.Share: 0, t.GoRoot + "/src": 0, t.Doc: 0}
	take := func(dir, into string, budget int64) Source {
		s := Source{Dir: dir, Into: into, Skip: next[dir], Budget: budget}
		next[dir] += budget
		return s
	}
	var imgs []Image
	for i := range 12 {
		// Images differ in their own bytes, one to three times.
		scale := int64(1 + i%3)
		img := Image{Name: fmt.Sprintf("app%02d", i), Layers: []Layer{distro, runtimes[i%2]}}
		if i%3 != 2 {
			img.Layers = append(img.Layers, tools)
		}
		img.Layers = append(img.Layers,
			Layer{take(t.Lib, "app/lib", 12*mib*scale)},
			Layer{take(t.Mod, "app/deps", 16*mib*scale)},
			Layer{take(t.Share, "app/assets", 12*mib*scale)},
			Layer{take(t.GoRoot+"/src", "app/config", 2*mib)},
		)
		if i%3 == 0 {
			for range 5 {
				img.Layers = append(img.Layers, Layer{take(t.Doc, "app/etc", mib/2)})
			}
		}
		imgs = append(imgs, img)
	}
	return imgs
}

// BigAndSmall is one large image, as ML and JDK images are (at least 1.5
// GiB on the wire, its largest layer over 500 MiB), asked for at once with
// ten small ones of 10 to 40 MiB. The first image is the large one; all
// share the node-boot base layer.
func BigAndSmall(t Trees) []Image {
	base := Layer{{Dir: t.Lib, Into: "usr/lib", Budget: 20 * mib}}
	// As an ML image: a runtime, one huge layer of packages, native
	// libraries, and weights that hardly compress (the module cache's
	// zips).
	big := Image{Name: "big", Layers: []Layer{
		base,
		{{Dir: t.JVM, Into: "usr/lib/jvm"}},
		{{Dir: t.App, Into: "opt/app"}},
		{{Dir: t.Lib, Into: "usr/local/lib"}},
		{{Dir: t.LLVM, Into: "usr/lib/llvm"}},
		{{Dir: t.GoRoot, Into: "usr/local/go"}},
		{{Dir: t.Mod + "/cache/download", Into: "opt/weights"}},
	}}
	trees := []string{t.Bin, t.Share, t.GoRoot + "/src", t.Doc, t.GCC}
	next := map[string]int64{}
	imgs := []Image{big}
	for i := range 10 {
		dir := trees[i%len(trees)]
		budget := int64(20+10*(i%4)) * mib
		own := Layer{{Dir: dir, Into: "app", Skip: next[dir], Budget: budget}}
		next[dir] += budget
		imgs = append(imgs, Image{Name: fmt.Sprintf("small%02d", i), Layers: []Layer{base, own}})
	}
	return imgs
}
