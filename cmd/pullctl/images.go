package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/docker/go-units"
	"github.com/urfave/cli/v3"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

func imagesCommand() *cli.Command {
	return &cli.Command{
		Name:      "images",
		Usage:     "list images (CRI ListImages)",
		ArgsUsage: "[REPOSITORY[:TAG]]",
		Flags:     []cli.Flag{outputFlag()},
		Action: withClient(func(cctx context.Context, cmd *cli.Command, c *client) error {
			req := &api.ListImagesRequest{}
			if ref := cmd.Args().First(); ref != "" {
				req.Filter = &criapi.ImageFilter{Image: &criapi.ImageSpec{Image: ref}}
			}
			resp, err := c.pullwise.ListImages(cctx, req)
			if err != nil {
				return c.explain("list images", err)
			}
			if cmd.String("output") == "json" {
				return printImagesJSON(cmd, resp)
			}
			w := newTable(cmd.Root().Writer)
			fmt.Fprintln(w, "IMAGE\tTAG\tIMAGE ID\tSIZE\tPINNED\tPULL SOURCE")
			for _, iws := range resp.GetImages() {
				img := iws.GetImage()
				pinned, source := "false", iws.GetPullSource()
				if img.GetPinned() {
					pinned = "true"
				}
				if source == "" {
					source = "-"
				}
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
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", repo, tag, id, size, pinned, source)
				}
			}
			return w.Flush()
		}),
	}
}

// printImagesJSON prints crictl's shape, {"images": [...]}, with each
// image's pullSource added.
func printImagesJSON(cmd *cli.Command, resp *api.ListImagesResponse) error {
	list := make([]map[string]any, 0, len(resp.GetImages()))
	for _, iws := range resp.GetImages() {
		out, err := statusJSON(iws.GetImage(), "pullSource", iws.GetPullSource(), nil)
		if err != nil {
			return err
		}
		list = append(list, out["status"].(map[string]any))
	}
	return printJSON(cmd.Root().Writer, map[string]any{"images": list})
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
