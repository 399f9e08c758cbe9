// Command pullctl is a crictl-style client for Pullwise: CRI plus the
// Pullwise API, on containerd's socket.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"

	"github.com/pullwise/pullwise/plugin/version"
)

const defaultEndpoint = "unix:///run/containerd/containerd.sock"

func main() {
	// Ctrl-C cancels what is running, a pull included, which leaves the
	// runtime's queue; a second Ctrl-C ends pullctl at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	if err := app().Run(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "pullctl:", err)
		os.Exit(1)
	}
}

func app() *cli.Command {
	return &cli.Command{
		Name:    "pullctl",
		Usage:   "inspect and drive image pulls on a Pullwise node",
		Version: version.Pullwise() + " (commit " + version.Commit() + ")",
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
				Usage: "timeout of connecting and of each short call to the runtime; pulls and progress streams last as long as they take (see pull --pull-timeout)",
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
