// Command containerd is containerd built with the Pullwise plugins.
//
// Its version (containerd --version, the start log, CRI's RuntimeVersion,
// containerd_build_info_total) is containerd's own version package, set at link
// time as upstream's release sets it, to what plugin/version makes: see
// hack/version.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/cmd/containerd/command"

	_ "github.com/pullwise/pullwise/cmd/containerd/builtins"
)

func main() {
	if err := command.App().Run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "containerd:", err)
		os.Exit(1)
	}
}
