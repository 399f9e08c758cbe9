package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/urfave/cli/v3"
	"golang.org/x/term"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// line is one line of a progress stream (KEP-5334).
type line struct {
	Image    string `json:"image,omitempty"`
	Layer    string `json:"layer,omitempty"`
	Progress int64  `json:"progress"`
	Total    int64  `json:"total"`
	Error    string `json:"error,omitempty"`
	// State is "lazy" for a layer a remote snapshotter mounted: done,
	// its bytes read from the registry later, on demand.
	State string `json:"state,omitempty"`
}

func progressCommand() *cli.Command {
	return &cli.Command{
		Name:      "progress",
		Usage:     "watch image pulls of a pod, a container or an image (KEP-5334)",
		ArgsUsage: "[POD_ID]",
		Flags: []cli.Flag{
			outputFlag(),
			&cli.StringFlag{Name: "container", Usage: "watch the image pull of a container"},
			&cli.StringFlag{Name: "image", Usage: "watch the pulls of an image reference"},
			&cli.BoolFlag{Name: "print-url", Usage: "print the stream URL and exit"},
		},
		Action: withLongClient(func(ctx context.Context, cmd *cli.Command, c *client) error {
			req := &api.ImagePullProgressRequest{
				PodSandboxId: cmd.Args().First(),
				ContainerId:  cmd.String("container"),
				Image:        cmd.String("image"),
			}
			sctx, cancel := c.short(ctx)
			defer cancel()
			resp, err := c.pullwise.ImagePullProgress(sctx, req)
			if err != nil {
				return c.explain("image pull progress", err)
			}
			if cmd.Bool("print-url") {
				fmt.Fprintln(cmd.Root().Writer, resp.GetUrl())
				return nil
			}
			// The stream lasts as long as the pulls, until Ctrl-C.
			return watch(ctx, resp.GetUrl(), cmd.Root().Writer, bars(cmd))
		}),
	}
}

// bars reports whether to draw bars: on a terminal, unless JSON is asked.
func bars(cmd *cli.Command) bool {
	f, ok := cmd.Root().Writer.(*os.File)
	return ok && cmd.String("output") != "json" && term.IsTerminal(int(f.Fd()))
}

// watch reads a progress stream until it ends, drawing bars or copying
// the NDJSON lines. It fails when a pull reported an error.
func watch(ctx context.Context, url string, out io.Writer, drawBars bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("open progress stream: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("progress stream: %s (a URL works once, within its lifetime)", resp.Status)
	}
	var view *barView
	if drawBars {
		view = newBarView(out)
		defer view.finish()
	}
	var failed []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("progress stream: bad line %q: %w", sc.Text(), err)
		}
		if l.Error != "" {
			failed = append(failed, fmt.Sprintf("%s: %s", l.Image, l.Error))
		}
		if view != nil {
			view.update(l)
			continue
		}
		fmt.Fprintln(out, sc.Text())
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("progress stream: %w", err)
	}
	if len(failed) > 0 {
		return fmt.Errorf("pull failed: %s", strings.Join(failed, "; "))
	}
	return nil
}

func shortDigest(d string) string {
	if i := strings.Index(d, ":"); i >= 0 && len(d) > i+13 {
		return "  " + d[:i+13]
	}
	return "  " + d
}
