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
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/containerd/v2/pkg/progress"
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
	if view != nil {
		view.draw(true)
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("progress stream: %w", err)
	}
	if len(failed) > 0 {
		return fmt.Errorf("pull failed: %s", strings.Join(failed, "; "))
	}
	return nil
}

// barView draws one bar per layer and one per image, with bytes, speed
// and ETA, redrawn in place by containerd's progress writer (as ctr does).
type barView struct {
	w      *progress.Writer
	start  time.Time
	last   time.Time
	rows   map[string]*row
	order  []string
	images map[string]bool
}

type row struct {
	l     line
	first time.Time // when progress was first seen
	base  int64     // progress at first
}

func newBarView(out io.Writer) *barView {
	return &barView{w: progress.NewWriter(out), start: time.Now(), rows: map[string]*row{}, images: map[string]bool{}}
}

func (v *barView) update(l line) {
	key := l.Image + " " + l.Layer
	r := v.rows[key]
	if r == nil {
		r = &row{first: time.Now(), base: l.Progress}
		v.rows[key] = r
		v.order = append(v.order, key)
	}
	r.l = l
	v.draw(false)
}

func (v *barView) draw(final bool) {
	if !final && time.Since(v.last) < 100*time.Millisecond {
		return
	}
	v.last = time.Now()
	tw := tabwriter.NewWriter(v.w, 1, 8, 2, ' ', 0)
	keys := slices.Clone(v.order)
	// Layers under their image, image summary last.
	slices.SortStableFunc(keys, func(a, b string) int {
		ra, rb := v.rows[a].l, v.rows[b].l
		if c := strings.Compare(ra.Image, rb.Image); c != 0 {
			return c
		}
		return boolCmp(ra.Layer == "", rb.Layer == "")
	})
	for _, k := range keys {
		r := v.rows[k]
		name := shortDigest(r.l.Layer)
		if r.l.Layer == "" {
			name = r.l.Image
		}
		frac := 0.0
		if r.l.Total > 0 {
			frac = float64(r.l.Progress) / float64(r.l.Total)
		}
		elapsed := time.Since(r.first)
		speed := progress.NewBytesPerSecond(r.l.Progress-r.base, elapsed)
		eta := "-"
		if rate := float64(r.l.Progress-r.base) / elapsed.Seconds(); rate > 0 && r.l.Total > r.l.Progress {
			eta = (time.Duration(float64(r.l.Total-r.l.Progress)/rate) * time.Second).Round(time.Second).String()
		}
		status := fmt.Sprintf("%s/%s", progress.Bytes(r.l.Progress), progress.Bytes(r.l.Total))
		if r.l.Error != "" {
			status = "error: " + r.l.Error
		}
		fmt.Fprintf(tw, "%s\t%40r\t%s\t%s\tETA %s\t\n", name, progress.Bar(frac), status, speed, eta)
	}
	tw.Flush()
	v.w.Flush()
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func shortDigest(d string) string {
	if i := strings.Index(d, ":"); i >= 0 && len(d) > i+13 {
		return "  " + d[:i+13]
	}
	return "  " + d
}
