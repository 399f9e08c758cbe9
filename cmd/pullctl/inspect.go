package main

import (
	"context"
	"fmt"

	"github.com/urfave/cli/v3"
	"google.golang.org/protobuf/proto"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// statusJSON is crictl's inspect shape, {"status": …, "info": …}, with the
// Pullwise field added inside status.
func statusJSON(status proto.Message, extraKey, extraValue string, info map[string]string) (map[string]any, error) {
	st, err := jsonTree(status)
	if err != nil {
		return nil, err
	}
	st[extraKey] = extraValue
	out := map[string]any{"status": st}
	if len(info) > 0 {
		out["info"] = info
	}
	return out, nil
}

func inspectiCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspecti",
		Usage:     "show an image's status, with the registry that served it",
		ArgsUsage: "IMAGE",
		Flags:     []cli.Flag{outputFlag()},
		Action: withClient(func(ctx context.Context, cmd *cli.Command, c *client) error {
			ref := cmd.Args().First()
			if ref == "" {
				return fmt.Errorf("inspecti needs an image reference or ID")
			}
			resp, err := c.pullwise.ImageStatus(ctx, &api.ImageStatusRequest{Image: &criapi.ImageSpec{Image: ref}, Verbose: true})
			if err != nil {
				return c.explain("image status", err)
			}
			if cmd.String("output") == "table" {
				img := resp.GetImage()
				w := newTable(cmd.Root().Writer)
				fmt.Fprintf(w, "ID:\t%s\n", img.GetId())
				for _, t := range img.GetRepoTags() {
					fmt.Fprintf(w, "RepoTag:\t%s\n", t)
				}
				for _, d := range img.GetRepoDigests() {
					fmt.Fprintf(w, "RepoDigest:\t%s\n", d)
				}
				fmt.Fprintf(w, "Pinned:\t%t\n", img.GetPinned())
				fmt.Fprintf(w, "PullSource:\t%s\n", resp.GetPullSource())
				return w.Flush()
			}
			out, err := statusJSON(resp.GetImage(), "pullSource", resp.GetPullSource(), resp.GetInfo())
			if err != nil {
				return err
			}
			return printJSON(cmd.Root().Writer, out)
		}),
	}
}

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:      "inspect",
		Usage:     "show a container's status, with the registry its image came from",
		ArgsUsage: "CONTAINER",
		Flags:     []cli.Flag{outputFlag()},
		Action: withClient(func(ctx context.Context, cmd *cli.Command, c *client) error {
			id := cmd.Args().First()
			if id == "" {
				return fmt.Errorf("inspect needs a container ID")
			}
			resp, err := c.pullwise.ContainerStatus(ctx, &api.ContainerStatusRequest{ContainerId: id, Verbose: true})
			if err != nil {
				return c.explain("container status", err)
			}
			if cmd.String("output") == "table" {
				st := resp.GetStatus()
				w := newTable(cmd.Root().Writer)
				fmt.Fprintf(w, "ID:\t%s\n", st.GetId())
				fmt.Fprintf(w, "Name:\t%s\n", st.GetMetadata().GetName())
				fmt.Fprintf(w, "State:\t%s\n", st.GetState())
				fmt.Fprintf(w, "Image:\t%s\n", st.GetImage().GetImage())
				fmt.Fprintf(w, "ImagePullSource:\t%s\n", resp.GetImagePullSource())
				return w.Flush()
			}
			out, err := statusJSON(resp.GetStatus(), "imagePullSource", resp.GetImagePullSource(), resp.GetInfo())
			if err != nil {
				return err
			}
			return printJSON(cmd.Root().Writer, out)
		}),
	}
}
