package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

type versionInfo struct {
	RuntimeName         string   `json:"runtimeName"`
	RuntimeVersion      string   `json:"runtimeVersion"`
	RuntimeAPIVersion   string   `json:"runtimeApiVersion"`
	PullwiseVersion     string   `json:"pullwiseVersion"`
	Commit              string   `json:"commit"`
	UpstreamVersion     string   `json:"upstreamVersion"`
	PullctlVersion      string   `json:"pullctlVersion"`
	CRIPullsUseTransfer bool     `json:"criPullsUseTransfer"`
	Warnings            []string `json:"warnings"`
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "show the runtime and Pullwise versions",
		Flags: []cli.Flag{outputFlag()},
		Action: withClient(func(cctx context.Context, cmd *cli.Command, c *client) error {
			rv, err := c.runtime.Version(cctx, &criapi.VersionRequest{})
			if err != nil {
				return c.explain("runtime version", err)
			}
			pv, err := c.pullwise.Version(cctx, &api.VersionRequest{})
			if err != nil {
				return c.explain("pullwise version", err)
			}
			info := versionInfo{
				RuntimeName:         rv.GetRuntimeName(),
				RuntimeVersion:      rv.GetRuntimeVersion(),
				RuntimeAPIVersion:   rv.GetRuntimeApiVersion(),
				PullwiseVersion:     pv.GetPullwiseVersion(),
				Commit:              pv.GetCommit(),
				UpstreamVersion:     pv.GetUpstreamVersion(),
				PullctlVersion:      cmd.Root().Version,
				CRIPullsUseTransfer: pv.GetCriPullsUseTransfer(),
				Warnings:            append([]string{}, pv.GetWarnings()...),
			}
			if cmd.String("output") == "json" {
				return printJSON(cmd.Root().Writer, info)
			}
			w := newTable(cmd.Root().Writer)
			fmt.Fprintf(w, "RuntimeName:\t%s\n", info.RuntimeName)
			fmt.Fprintf(w, "RuntimeVersion:\t%s\n", info.RuntimeVersion)
			fmt.Fprintf(w, "RuntimeApiVersion:\t%s\n", info.RuntimeAPIVersion)
			fmt.Fprintf(w, "PullwiseVersion:\t%s\n", info.PullwiseVersion)
			fmt.Fprintf(w, "Commit:\t%s\n", info.Commit)
			fmt.Fprintf(w, "UpstreamVersion:\t%s\n", info.UpstreamVersion)
			fmt.Fprintf(w, "PullctlVersion:\t%s\n", info.PullctlVersion)
			fmt.Fprintf(w, "CRIPullsUseTransfer:\t%t\n", info.CRIPullsUseTransfer)
			for _, warning := range info.Warnings {
				fmt.Fprintf(w, "Warning:\t%s\n", warning)
			}
			return w.Flush()
		}),
	}
}
