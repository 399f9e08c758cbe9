package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// terminal is a tmux session running one command on a real pseudo
// terminal, to see pullctl as a person at a terminal does.
type terminal struct {
	t    *testing.T
	sock string
}

func newTerminal(t *testing.T, cols, rows int, command string) *terminal {
	t.Helper()
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is needed to test pullctl on a real terminal (.ci/run installs it)")
	}
	term := &terminal{t: t, sock: filepath.Join(t.TempDir(), "tmux.sock")}
	// A first line that must stay on top: tmux keeps in its history what
	// a clear from the very top of the screen erases, which would count
	// a redraw in place as scrolling. The pane stays after the command so
	// its last screen can be read.
	term.tmux("new-session", "-d", "-x", fmt.Sprint(cols), "-y", fmt.Sprint(rows), `echo "$ pullctl"; `+command+`; echo "exit=$?"; sleep 3600`)
	t.Cleanup(func() { _ = exec.Command("tmux", "-S", term.sock, "kill-server").Run() })
	return term
}

func (term *terminal) tmux(args ...string) string {
	term.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", term.sock}, args...)...).CombinedOutput()
	if err != nil {
		term.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// screen is what the terminal shows now.
func (term *terminal) screen() string { return term.tmux("capture-pane", "-p") }

// scrolled reports how many lines went up out of the screen, and whether
// the first line printed is still the top one.
func (term *terminal) scrolled() (string, bool) {
	top, _, _ := strings.Cut(term.screen(), "\n")
	return strings.TrimSpace(term.tmux("display-message", "-p", "#{history_size}")), top == "$ pullctl"
}

// TestPullctlLongPullOnATerminal: a pull that takes about 20 seconds, twice
// the default --timeout, succeeds through `pullctl pull` with default flags.
// On a real terminal its image line sums the layers while they move, and
// the bars redraw in place: nothing scrolls. `pullctl progress` off a
// terminal streams NDJSON for as long as the pull lasts.
func TestPullctlLongPullOnATerminal(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("slow/app", "v1", registry.Image{Layers: []int64{2 << 20, 2 << 20}, Seed: 9400})
	// About 2 MiB per layer at 100 KiB/s each, in parallel: 20 s.
	throttleBlobs(e.upstream, 100<<10)

	progressOut := make(chan string, 1)
	go func() {
		out, err := e.pullctl("progress", "--image", img.Ref)
		progressOut <- fmt.Sprintf("%s(err %v)", out, err)
	}()
	// A watcher that joins late still gets the pull's state, and the pull
	// takes 20 s: the order of the two does not matter.

	term := newTerminal(t, 120, 30, fmt.Sprintf("%s -r %s pull %s", daemon.Bin("pullctl"), e.d.Endpoint(), img.Ref))
	// The image line mid-way: a part of the whole, above its layers.
	layerLine := regexp.MustCompile(`(?m)^  sha256:[0-9a-f]{12}\s+\[`)
	midway := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(img.Ref) + `\s+\[[=>-]+\]\s+(\d+\.\d) (KiB|MiB) / 4\.0 MiB`)
	var seen string
	eventually(t, time.Minute, "the image line part-way", func() bool {
		s := term.screen()
		if m := midway.FindStringSubmatch(s); m != nil && m[1] != "0.0" && len(layerLine.FindAllString(s, -1)) == 2 {
			seen = s
			return true
		}
		return false
	})
	start := time.Now()
	var final string
	eventually(t, 2*time.Minute, "pullctl pull ends", func() bool {
		final = term.screen()
		return strings.Contains(final, "exit=")
	})
	t.Logf("mid-way:\n%s\nend (%s later):\n%s", seen, time.Since(start).Round(time.Second), final)
	if !strings.Contains(final, "exit=0") || !strings.Contains(final, "Pulled "+img.Ref) {
		t.Fatalf("pullctl pull failed on a 20 s pull with default flags:\n%s", final)
	}
	done := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(img.Ref) + `\s+\[=+\]\s+4\.0 MiB / 4\.0 MiB .*done`)
	if !done.MatchString(final) || layerLine.MatchString(final) {
		t.Fatalf("the last screen should hold the finished image line and no layer:\n%s", final)
	}
	if n, top := term.scrolled(); n != "0" || !top {
		t.Fatalf("%s lines scrolled off the terminal (first line still on top: %v): bars must redraw in place", n, top)
	}

	out := <-progressOut
	var last progressLine
	sc := bufio.NewScanner(strings.NewReader(out))
	lines := 0
	for sc.Scan() {
		var l progressLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			break
		}
		last = l
		lines++
	}
	if lines == 0 || last.Image != img.Ref || last.Layer != "" || last.Total != img.LayerBytes() || last.Progress != last.Total || !strings.HasSuffix(out, "(err <nil>)") {
		t.Fatalf("pullctl progress off a terminal (%d NDJSON lines, last %+v, want total %d):\n%s", lines, last, img.LayerBytes(), out[max(0, len(out)-400):])
	}
}

// pullctlCmd starts pullctl without waiting for it.
type pullctlCmd struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan error
}

func (e *env) startPullctl(args ...string) *pullctlCmd {
	e.t.Helper()
	p := &pullctlCmd{done: make(chan error, 1)}
	p.cmd = exec.Command(daemon.Bin("pullctl"), append([]string{"-r", e.d.Endpoint()}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	e.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// interrupt sends Ctrl-C and waits for pullctl to end; it returns what
// pullctl printed and its exit error.
func (p *pullctlCmd) interrupt(t *testing.T) (string, error) {
	t.Helper()
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		return p.out.String(), err
	case <-time.After(30 * time.Second):
		t.Fatal("pullctl did not end within 30 s of Ctrl-C")
	}
	return "", nil
}

// TestPullctlCtrlC: Ctrl-C on `pullctl pull` cancels the pull. A queued
// pull leaves the queue without fetching a blob; a pull holding the only
// slot frees it for the next one; `pullctl pulls` ends empty.
func TestPullctlCtrlC(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	held := e.push("ctrlc/held", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 9500})
	queued := e.push("ctrlc/queued", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 9501})
	release := e.upstream.HoldBlobs(t, func(repo string) bool { return repo == "ctrlc/held" })

	first := e.startPullctl("pull", held.Ref)
	eventually(t, 30*time.Second, "the first pull holds the slot", func() bool { return e.pullsIn("pulling") == 1 })
	second := e.startPullctl("pull", queued.Ref)
	eventually(t, 30*time.Second, "the second pull waits", func() bool { return e.pullsIn("waiting") == 1 })

	out, err := second.interrupt(t)
	if err == nil || !strings.Contains(out, "pull "+queued.Ref+": cancelled") {
		t.Fatalf("Ctrl-C on a queued pull: exit %v, output:\n%s", err, out)
	}
	eventually(t, 10*time.Second, "the queued pull leaves the queue", func() bool {
		pulls := e.listPulls()
		return len(pulls) == 1 && pulls[0].GetImage() == held.Ref
	})
	if n := e.upstream.Count(blobsOf("ctrlc/queued")); n != 0 {
		t.Fatalf("the cancelled queued pull fetched %d blobs", n)
	}

	out, err = first.interrupt(t)
	if err == nil || !strings.Contains(out, "cancelled") {
		t.Fatalf("Ctrl-C on a pull in flight: exit %v, output:\n%s", err, out)
	}
	release()
	eventually(t, 10*time.Second, "no pull left", func() bool { return len(e.listPulls()) == 0 })
	// The slot is free: with a limit of 1, a new pull goes through.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.pullwise.PullImage(ctx, &api.PullImageRequest{Image: criImage(queued.Ref)}); err != nil {
		t.Fatalf("a pull after both cancellations: %v", err)
	}
	out, err = e.pullctl("pulls", "-o", "json")
	if err != nil || strings.Join(strings.Fields(out), "") != `{"pulls":[]}` {
		t.Fatalf("pullctl pulls -o json after: %v\n%s", err, out)
	}
	if e.metric("pullwise_pulls_in_flight") != 0 || e.metric("pullwise_pulls_waiting") != 0 {
		t.Fatal("the gate's gauges did not return to 0")
	}
}

// TestPullctlJSON: -o json gives scripts numbers for counts, sizes and
// durations (with the unit in the key), and names the pod of each pull.
func TestPullctlJSON(t *testing.T) {
	e := newEnv(t, envOptions{extraConfig: gateConfig(1, "0s")})
	img := e.push("json/app", "v1", registry.Image{Layers: []int64{64 << 10}, Seed: 9600})
	release := e.upstream.HoldBlobs(t, func(string) bool { return true })
	pulled := make(chan error, 1)
	go func() {
		_, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, sandbox("web"))
		pulled <- err
	}()
	eventually(t, 30*time.Second, "the pull in flight", func() bool { return e.pullsIn("pulling") == 1 })

	out, err := e.pullctl("pulls", "-o", "json")
	var pulls struct {
		Pulls []map[string]any `json:"pulls"`
	}
	if err != nil || json.Unmarshal([]byte(out), &pulls) != nil || len(pulls.Pulls) != 1 {
		t.Fatalf("pullctl pulls -o json (err %v):\n%s", err, out)
	}
	p := pulls.Pulls[0]
	for _, key := range []string{"waitedMs", "bytesDone", "bytesTotal", "callers"} {
		if _, ok := p[key].(float64); !ok {
			t.Errorf("%s is %T (%v), want a JSON number", key, p[key], p[key])
		}
	}
	pod, _ := p["pod"].(map[string]any)
	if p["image"] != img.Ref || p["state"] != "pulling" || pod["namespace"] != "default" || pod["name"] != "web" || pod["uid"] != "uid-web" {
		t.Errorf("pull %v, want %s pulling for default/web", p, img.Ref)
	}
	release()
	if err := <-pulled; err != nil {
		t.Fatal(err)
	}

	out, err = e.pullctl("images", "-o", "json")
	var images struct {
		Images []map[string]any `json:"images"`
	}
	if err != nil || json.Unmarshal([]byte(out), &images) != nil || len(images.Images) != 1 {
		t.Fatalf("pullctl images -o json (err %v):\n%s", err, out)
	}
	if size, ok := images.Images[0]["size"].(float64); !ok || size <= 64<<10 {
		t.Errorf("image size is %T %v, want a JSON number above the layer's size", images.Images[0]["size"], images.Images[0]["size"])
	}
}
