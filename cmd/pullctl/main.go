// Command pullctl is a crictl-style client for Pullwise: CRI plus the
// Pullwise API, on containerd's socket.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/pullwise/pullwise/plugin/version"
)

const defaultEndpoint = "unix:///run/containerd/containerd.sock"

func main() {
	if err := app().Run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "pullctl:", err)
		os.Exit(1)
	}
}

func app() *cli.Command {
	return &cli.Command{
		Name:    "pullctl",
		Usage:   "inspect and drive image pulls on a Pullwise node",
		Version: version.Version,
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:    "runtime-endpoint",
				Aliases: []string{"r"},
				Usage:   "container runtime endpoint",
				Sources: cli.EnvVars("CONTAINER_RUNTIME_ENDPOINT"),
				Value:   defaultEndpoint,
			},
			&cli.DurationFlag{
				Name:  "timeout",
				Usage: "timeout of each call to the runtime",
				Value: 10 * time.Second,
			},
		},
		Commands: []*cli.Command{versionCommand(), imagesCommand(), inspectiCommand(), inspectCommand(), pullCommand(), pullsCommand(), progressCommand(), registriesCommand()},
	}
}

// outputFlag is -o on every command with structured output.
func outputFlag() cli.Flag {
	return &cli.StringFlag{
		Name:    "output",
		Aliases: []string{"o"},
		Usage:   "output format: table or json",
		Value:   "table",
		Validator: func(s string) error {
			if s != "table" && s != "json" {
				return fmt.Errorf("unknown output format %q: use table or json", s)
			}
			return nil
		},
	}
}
