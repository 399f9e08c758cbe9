package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

// demo narrates: headings, notes and the pullctl commands a user would
// type, run for real against the demo's containerd.
type demo struct {
	s       *stack
	out     io.Writer
	tty     bool            // stdout is a terminal: bold headings, and pullctl draws bars
	enter   <-chan struct{} // lines typed on stdin; nil when not pausing
	contrib string
	step    int
	bg      sync.WaitGroup // background pulls
}

const steps = 5

// heading starts a step; numbered when n is true.
func (d *demo) heading(title string) {
	if d.tty {
		title = "\x1b[1m" + title + "\x1b[0m"
	}
	fmt.Fprintf(d.out, "\n==> %s\n", title)
}

func (d *demo) stepHeading(title string) {
	d.step++
	d.heading(fmt.Sprintf("%d/%d %s", d.step, steps, title))
}

// note says what the output above or below shows.
func (d *demo) note(format string, args ...any) {
	fmt.Fprintf(d.out, "    "+format+"\n", args...)
}

// pause waits for Enter between steps when a person is watching.
func (d *demo) pause(ctx context.Context) error {
	if d.enter == nil {
		return ctx.Err()
	}
	// Forget Enter pressed while the step ran.
	select {
	case <-d.enter:
	default:
	}
	fmt.Fprint(d.out, "\n[Enter: next step, Ctrl-C: stop]")
	select {
	case <-d.enter:
		return nil
	case <-ctx.Done():
		fmt.Fprintln(d.out)
		return ctx.Err()
	}
}

// pullctl is the command for pullctl args against the demo's containerd.
// The endpoint and a generous timeout are left out of what is shown.
func (d *demo) pullctl(ctx context.Context, args ...string) *exec.Cmd {
	global := []string{"-r", "unix://" + d.s.path("containerd.sock"), "--timeout", "2m"}
	return exec.CommandContext(ctx, filepath.Join(d.s.bin, "pullctl"), append(global, args...)...)
}

// show prints a pullctl command line and runs it on the terminal.
func (d *demo) show(ctx context.Context, args ...string) error {
	fmt.Fprintf(d.out, "$ pullctl %s\n", strings.Join(args, " "))
	cmd := d.pullctl(ctx, args...)
	// Stdin too: the bars measure the terminal through it.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pullctl %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// timed is show, returning how long the command took.
func (d *demo) timed(ctx context.Context, args ...string) (time.Duration, error) {
	start := time.Now()
	err := d.show(ctx, args...)
	return time.Since(start), err
}

// bgPull is a `pullctl pull` running while the demo shows something else.
type bgPull struct {
	args []string
	out  bytes.Buffer
	err  error
	done chan struct{}
}

// pullInBackground starts pullctl pull args; its output is kept for later.
func (d *demo) pullInBackground(ctx context.Context, args ...string) *bgPull {
	p := &bgPull{args: append([]string{"pull"}, args...), done: make(chan struct{})}
	fmt.Fprintf(d.out, "$ pullctl %s &\n", strings.Join(p.args, " "))
	cmd := d.pullctl(ctx, p.args...)
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	d.bg.Add(1)
	go func() {
		defer d.bg.Done()
		defer close(p.done)
		p.err = cmd.Run()
	}()
	return p
}

// wait waits for p and prints its output.
func (d *demo) wait(ctx context.Context, p *bgPull) error {
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Fprintf(d.out, "[pullctl %s]\n%s", strings.Join(p.args, " "), p.out.String())
	if p.err != nil {
		return fmt.Errorf("pullctl %s: %w", strings.Join(p.args, " "), p.err)
	}
	return nil
}

// awaitPulls polls the daemon's pull list until cond holds for it.
func (d *demo) awaitPulls(ctx context.Context, what string, cond func([]*api.Pull) bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		resp, err := d.s.api.ListPulls(ctx, &api.ListPullsRequest{})
		if err == nil && cond(resp.GetPulls()) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// seconds formats d for a person: 2.6s, 45ms.
func seconds(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}
