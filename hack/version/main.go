// Command version prints the -ldflags that give containerd's own version
// package (github.com/containerd/containerd/v2/version) the version
// plugin/version makes: the upstream release with the Pullwise version
// and commit. The Makefile and hack/release.sh build containerd, ctr and
// the shim with them. They have to be link flags: containerd registers its
// containerd_build_info_total metric from that package in an init that runs
// before any code of Pullwise's could set it.
//
// Run it with the same -ldflags -X for plugin/version as the binaries.
package main

import (
	"fmt"

	// The containerd module in this build's module graph, where
	// plugin/version reads the upstream version.
	_ "github.com/containerd/containerd/v2/version"

	"github.com/pullwise/pullwise/plugin/version"
)

func main() {
	const pkg = "github.com/containerd/containerd/v2/version"
	fmt.Printf("-X %s.Package=%s -X %s.Version=%s -X %s.Revision=%s\n",
		pkg, version.Package, pkg, version.Runtime(), pkg, version.Commit())
}
