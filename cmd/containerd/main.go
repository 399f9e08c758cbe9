// Command containerd is containerd built with the Pullwise plugins.
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
