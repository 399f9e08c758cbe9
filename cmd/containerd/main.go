// Command containerd is containerd built with the Pullwise plugins.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/containerd/command"
	ctrdversion "github.com/containerd/containerd/v2/version"

	_ "github.com/pullwise/pullwise/cmd/containerd/builtins"
	"github.com/pullwise/pullwise/plugin/version"
)

// containerd's own release sets these with -ldflags -X. Set here instead,
// from the module graph and the VCS stamp, so that `containerd --version`,
// the start log and CRI's RuntimeVersion name the upstream release, the
// Pullwise version and the commit however the binary was built. They are
// set before command.App reads them.
func init() {
	ctrdversion.Package = version.Package
	ctrdversion.Version = version.Runtime()
	ctrdversion.Revision = version.Commit()
}

func main() {
	if err := command.App().Run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "containerd:", err)
		os.Exit(1)
	}
}
