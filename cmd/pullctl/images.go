package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v3"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func imagesCommand() *cli.Command {
	return &cli.Command{
		Name:      "images",
		Usage:     "list images (CRI ListImages)",
		ArgsUsage: "[REPOSITORY[:TAG]]",
		Flags:     []cli.Flag{outputFlag()},
		Action: withClient(func(cctx context.Context, cmd *cli.Command, c *client) error {
			req := &criapi.ListImagesRequest{}
			if ref := cmd.Args().First(); ref != "" {
				req.Filter = &criapi.ImageFilter{Image: &criapi.ImageSpec{Image: ref}}
			}
			resp, err := c.images.ListImages(cctx, req)
			if err != nil {
				return c.explain("list images", err)
			}
			if cmd.String("output") == "json" {
				return printJSON(cmd.Root().Writer, resp)
			}
			w := newTable(cmd.Root().Writer)
			fmt.Fprintln(w, "IMAGE\tTAG\tIMAGE ID\tSIZE")
			for _, img := range resp.GetImages() {
				id := strings.TrimPrefix(img.GetId(), "sha256:")
				id = id[:min(13, len(id))]
				size := units.HumanSizeWithPrecision(float64(img.GetSize()), 3)
				tags := img.GetRepoTags()
				if len(tags) == 0 {
					for _, d := range img.GetRepoDigests() {
						tags = append(tags, strings.SplitN(d, "@", 2)[0]+":<none>")
					}
				}
				for _, t := range tags {
					repo, tag := splitTag(t)
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", repo, tag, id, size)
				}
			}
			return w.Flush()
		}),
	}
}

// splitTag splits repo:tag at the last colon after the last slash, so a
// registry port is not taken for a tag.
func splitTag(ref string) (string, string) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || i < strings.LastIndex(ref, "/") {
		return ref, "<none>"
	}
	return ref[:i], ref[i+1:]
}
