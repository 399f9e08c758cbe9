package main

import (
	"context"
	"fmt"
	"time"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v3"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

func pullsCommand() *cli.Command {
	return &cli.Command{
		Name:  "pulls",
		Usage: "list image pulls in flight or waiting for a slot",
		Flags: []cli.Flag{outputFlag()},
		Action: withClient(func(ctx context.Context, cmd *cli.Command, c *client) error {
			resp, err := c.pullwise.ListPulls(ctx, &api.ListPullsRequest{})
			if err != nil {
				return c.explain("list pulls", err)
			}
			if cmd.String("output") == "json" {
				return printJSON(cmd.Root().Writer, resp)
			}
			w := newTable(cmd.Root().Writer)
			fmt.Fprintln(w, "IMAGE\tPOD\tSTATE\tCALLERS\tWAITED\tPROGRESS\tFROM PEERS")
			for _, p := range resp.GetPulls() {
				pod := "-"
				if md := p.GetPod(); md != nil {
					pod = md.GetNamespace() + "/" + md.GetName()
				}
				progress := "-"
				if p.GetBytesTotal() > 0 {
					progress = fmt.Sprintf("%s / %s", units.HumanSize(float64(p.GetBytesDone())), units.HumanSize(float64(p.GetBytesTotal())))
				}
				peers := "-"
				if n := p.GetBytesFromPeers(); n > 0 {
					peers = units.HumanSize(float64(n))
				}
				waited := (time.Duration(p.GetWaitedMs()) * time.Millisecond).Round(100 * time.Millisecond)
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", p.GetImage(), pod, p.GetState(), p.GetCallers(), waited, progress, peers)
			}
			return w.Flush()
		}),
	}
}
