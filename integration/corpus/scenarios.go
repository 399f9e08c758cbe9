package corpus

import (
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
	Pause  string // a directory holding only the pause binary
}

// LocalTrees finds the trees on a Debian machine with Go; pause is the
// directory of the pause binary.
func LocalTrees(pause string) (Trees, error) {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return Trees{}, err
	}
	return Trees{
		GoRoot: strings.TrimSpace(string(out)),
		Lib:    "/usr/lib/x86_64-linux-gnu",
		Bin:    "/usr/bin",
		GCC:    "/usr/lib/gcc",
		Doc:    "/usr/share/doc",
		Pause:  pause,
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
