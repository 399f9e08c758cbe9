package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v3"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

var pullPolicies = map[string]api.PullPolicy{
	"always":            api.PullPolicy_ALWAYS,
	"ifnotpresent":      api.PullPolicy_IF_NOT_PRESENT,
	"ifnewernotpresent": api.PullPolicy_IF_NEWER_NOT_PRESENT,
	"never":             api.PullPolicy_NEVER,
}

// pullResult has every key always present, pulled included when false, so
// scripts can rely on the shape.
type pullResult struct {
	ImageRef     string   `json:"imageRef"`
	Pulled       bool     `json:"pulled"`
	Reason       string   `json:"reason"`
	LocalDigest  string   `json:"localDigest"`
	RemoteDigest string   `json:"remoteDigest"`
	PullSource   string   `json:"pullSource"`
	Warnings     []string `json:"warnings"`
}

func pullCommand() *cli.Command {
	return &cli.Command{
		Name:      "pull",
		Usage:     "pull an image with a pull policy and show what was decided",
		ArgsUsage: "IMAGE",
		Flags: []cli.Flag{
			outputFlag(),
			&cli.StringFlag{
				Name:  "policy",
				Usage: "Always, IfNotPresent, IfNewerNotPresent or Never",
				Value: "Always",
				Validator: func(s string) error {
					if _, ok := pullPolicies[strings.ToLower(s)]; !ok {
						return fmt.Errorf("unknown pull policy %q: use Always, IfNotPresent, IfNewerNotPresent or Never", s)
					}
					return nil
				},
			},
			&cli.StringFlag{Name: "creds", Usage: "registry credentials as USER:PASSWORD"},
			&cli.DurationFlag{Name: "pull-timeout", Usage: "give up on the pull after this long, waiting in the queue included; 0 waits as long as the pull makes progress"},
		},
		Action: withLongClient(func(ctx context.Context, cmd *cli.Command, c *client) error {
			ref := cmd.Args().First()
			if ref == "" {
				return fmt.Errorf("pull needs an image reference")
			}
			req := &api.PullImageRequest{
				Image:      &criapi.ImageSpec{Image: ref},
				PullPolicy: pullPolicies[strings.ToLower(cmd.String("policy"))],
			}
			if creds := cmd.String("creds"); creds != "" {
				user, pass, _ := strings.Cut(creds, ":")
				req.Auth = &criapi.AuthConfig{Username: user, Password: pass}
			}
			if d := cmd.Duration("pull-timeout"); d > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			}
			stopBars := showBars(ctx, cmd, c, ref)
			resp, err := c.pullwise.PullImage(ctx, req)
			stopBars()
			if err != nil {
				return c.explain("pull "+ref, err)
			}
			res := pullResult{
				ImageRef: resp.GetImageRef(), Pulled: resp.GetPulled(), Reason: resp.GetReason(),
				LocalDigest: resp.GetLocalDigest(), RemoteDigest: resp.GetRemoteDigest(),
				PullSource: resp.GetPullSource(), Warnings: append([]string{}, resp.GetWarnings()...),
			}
			if cmd.String("output") == "json" {
				return printJSON(cmd.Root().Writer, res)
			}
			verb := "Not pulled"
			if res.Pulled {
				verb = "Pulled"
			}
			fmt.Fprintf(cmd.Root().Writer, "%s %s (%s): %s\n", verb, ref, res.Reason, res.ImageRef)
			if res.PullSource != "" {
				fmt.Fprintf(cmd.Root().Writer, "Source: %s\n", res.PullSource)
			}
			for _, w := range res.Warnings {
				fmt.Fprintf(cmd.Root().ErrWriter, "Warning: %s\n", w)
			}
			return nil
		}),
	}
}

// showBars draws the pull's progress on a terminal while it runs. The
// returned func waits briefly for the stream to finish (it ends by itself
// when the pull does) and then stops it: a pull that needed no transfer
// never shows up in the stream.
func showBars(ctx context.Context, cmd *cli.Command, c *client, ref string) (stop func()) {
	if !bars(cmd) {
		return func() {}
	}
	sctx, cancel := c.short(ctx)
	defer cancel()
	resp, err := c.pullwise.ImagePullProgress(sctx, &api.ImagePullProgressRequest{Image: ref})
	if err != nil {
		return func() {}
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = watch(wctx, resp.GetUrl(), cmd.Root().Writer, true)
	}()
	return func() {
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		}
		cancel()
		<-done
	}
}
