package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/daemon"
)

// TestDemo runs `make demo`'s program: once to its end on a terminal,
// checking that each step showed what it claims, and once interrupted
// mid-way with its output going to a pipe. Either way nothing it started
// may be left running or mounted.
func TestDemo(t *testing.T) {
	bin := buildDemo(t)
	t.Run("Complete", func(t *testing.T) {
		t.Parallel()
		testDemoComplete(t, bin)
	})
	t.Run("Interrupted", func(t *testing.T) {
		t.Parallel()
		testDemoInterrupted(t, bin)
	})
}

// buildDemo builds hack/demo, which `make demo` builds the same way.
func buildDemo(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "pullwise-demo")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../hack/demo").CombinedOutput(); err != nil {
		t.Fatalf("build the demo: %v\n%s", err, out)
	}
	return bin
}

func demoArgs(dir string) []string {
	return []string{"-dir", dir, "-bin", filepath.Dir(daemon.Bin("containerd")), "-config", "../contrib/config.toml", "-no-pause"}
}

func testDemoComplete(t *testing.T, bin string) {
	dir := t.TempDir()
	// script(1) gives the demo a terminal of a known size, as `make demo`
	// in a shell has, so pullctl draws its bars.
	shell := fmt.Sprintf("stty cols 120 rows 40; exec %s %s", bin, strings.Join(demoArgs(dir), " "))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	raw, err := exec.CommandContext(ctx, "script", "-qefc", shell, "/dev/null").Output()
	out := strings.ReplaceAll(string(raw), "\r\n", "\n")
	t.Logf("demo ran %s", time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	assertLeftNothing(t, dir)

	up, mirror := demoHost(t, out, "upstream"), demoHost(t, out, "mirror")
	steps := demoSteps(t, out)
	ref := func(repo string) string { return up + "/demo/" + repo + ":1.0" }
	want := func(step int, what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("step %d: %s; it printed:\n%s", step, what, steps[step])
		}
	}

	// 1: a first pull with live bars, served by the mirror.
	// Live: the bars are redrawn in place, moving the cursor up.
	bars, _, _ := strings.Cut(steps[1], "Pulled ")
	want(1, "no bars redrawn on a terminal", regexp.MustCompile(`\x1b\[\d*A`).MatchString(bars) && strings.Contains(bars, "sha256:"))
	want(1, "web not pulled as not-present", strings.Contains(steps[1], "Pulled "+ref("web")+" (not-present)"))
	want(1, "source does not name the mirror", strings.Contains(steps[1], "Source: "+mirror+"/demo/web:1.0"))

	// 2: the pull source in pullctl images.
	want(2, "images does not show web's pull source as the mirror",
		regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(up+"/demo/web")+`\s+1\.0\s.*\s`+regexp.QuoteMeta(mirror+"/demo/web:1.0")+`\s*$`).MatchString(steps[2]))

	// 3: the fast path: one HEAD, no layer; IfNotPresent asks nothing.
	want(3, "re-pull not reported", strings.Contains(steps[3], "Pulled "+ref("web")+" (policy-always)"))
	want(3, "fast path did more than one HEAD", strings.Contains(steps[3], "the mirror answered 1 request (HEAD manifest) and sent 0B of layers"))
	want(3, "IfNotPresent pulled", strings.Contains(steps[3], "Not pulled "+ref("web")+" (present)"))
	want(3, "IfNotPresent asked the mirror", strings.Contains(steps[3], "the mirror answered no request"))

	// 4: pulls held by the limit of 2, in pullctl pulls.
	listings := pullsListings(steps[4])
	if len(listings) != 2 {
		t.Fatalf("step 4: want 2 pulls listings, got %d:\n%s", len(listings), steps[4])
	}
	want(4, "first listing is not 2 pulling and 2 waiting", stateCount(listings[0], "pulling") == 2 && stateCount(listings[0], "waiting") == 2)
	// The pulls start at once, so which two wait is up to the race; FIFO
	// means the two that waited are the two that pull next.
	waited := regexp.MustCompile(`(?m)^(\S+)\s.*\swaiting\s`).FindAllStringSubmatch(listings[0], -1)
	want(4, "second listing is not the waiting pair pulling", stateCount(listings[1], "pulling") == 2 && stateCount(listings[1], "waiting") == 0 &&
		len(waited) == 2 && strings.Contains(listings[1], waited[0][1]+" ") && strings.Contains(listings[1], waited[1][1]+" "))
	for _, repo := range []string{"api", "worker", "cache", "db"} {
		want(4, repo+" not pulled through the mirror", strings.Contains(steps[4], "Pulled "+ref(repo)+" (not-present)") &&
			strings.Contains(steps[4], "Source: "+mirror+"/demo/"+repo+":1.0"))
	}

	// 5: the mirror goes down mid-pull; upstream finishes it and serves
	// the next pull alone; the mirror shows down.
	want(5, "batch pull failed", strings.Contains(steps[5], "Pulled "+ref("batch")+" (not-present)"))
	want(5, "no layer resumed on upstream", strings.Contains(steps[5], "with Range: bytes="))
	want(5, "registries does not show the mirror down",
		regexp.MustCompile(`(?m)^http://`+regexp.QuoteMeta(mirror)+`/v2\s+registry\s+down\s`).MatchString(steps[5]))
	want(5, "report not pulled from upstream", strings.Contains(steps[5], "Pulled "+ref("report")+" (not-present)") &&
		strings.Contains(steps[5], "Source: "+ref("report")))
	skipped := regexp.MustCompile(`none of its (\d+) requests to the mirror`).FindStringSubmatch(steps[5])
	want(5, "report's requests did not skip the mirror", skipped != nil && skipped[1] != "0")

	if !strings.Contains(out, "containerd and both registries stopped") {
		t.Errorf("no word of stopping:\n%s", out)
	}
}

func testDemoInterrupted(t *testing.T, bin string) {
	dir := t.TempDir()
	cmd := exec.Command(bin, demoArgs(dir)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The reader ends when the demo closes its stdout, or when the test
	// is over and nobody reads any more.
	lines, over := make(chan string), make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-over:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(over)
		_ = cmd.Process.Kill() // no-op once it exited
	})
	var out strings.Builder
	// readUntil reads lines until stop accepts one or the output ends.
	readUntil := func(timeout time.Duration, stop func(string) bool) bool {
		deadline := time.After(timeout)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return false
				}
				out.WriteString(l + "\n")
				if stop(l) {
					return true
				}
			case <-deadline:
				t.Fatalf("demo output stalled for %s:\n%s", timeout, out.String())
			}
		}
	}

	// Interrupt while the queued pulls are in flight: a daemon mid-pull,
	// pullctl processes waiting on it.
	if !readUntil(time.Minute, func(l string) bool { return strings.HasPrefix(l, "$ pullctl pulls") }) {
		t.Fatalf("demo ended before its queued pulls:\n%s\n%s", out.String(), stderr.String())
	}
	if procs := processesUsing(t, dir); len(procs) == 0 {
		t.Fatalf("no process runs under %s while the demo pulls: nothing to stop", dir)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	readUntil(30*time.Second, func(string) bool { return false })
	err = cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 130 {
		t.Errorf("exit after SIGINT: %v, want status 130\nstdout:\n%s\nstderr:\n%s", err, out.String(), stderr.String())
	}
	assertLeftNothing(t, dir)
	if !strings.Contains(out.String(), "Interrupted") || !strings.Contains(out.String(), "containerd and both registries stopped") {
		t.Errorf("no word of the interrupt and the stop:\n%s", out.String())
	}
	if strings.Contains(out.String(), "\x1b[") {
		t.Errorf("terminal escapes in output to a pipe:\n%q", out.String())
	}
}

// assertLeftNothing fails t unless containerd was stopped (SIGTERM, not
// killed), no process still runs with dir in its command line
// (containerd, pullctl) and nothing is mounted under dir.
func assertLeftNothing(t *testing.T, dir string) {
	t.Helper()
	log, err := os.ReadFile(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "Stop CRI service") {
		t.Errorf("containerd did not shut down in order; its log ends:\n%s", log[max(0, len(log)-2000):])
	}
	if procs := processesUsing(t, dir); len(procs) > 0 {
		t.Errorf("left running: %s", strings.Join(procs, "; "))
	}
	mounts, err := daemon.MountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) > 0 {
		t.Errorf("left mounted: %v", mounts)
	}
}

// processesUsing lists "PID cmdline" of the processes whose command line
// names dir.
func processesUsing(t *testing.T, dir string) []string {
	t.Helper()
	pids, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, p := range pids {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // gone meanwhile
		}
		cmdline := strings.ReplaceAll(strings.TrimRight(string(b), "\x00"), "\x00", " ")
		if strings.Contains(cmdline, dir) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			if pid != os.Getpid() {
				found = append(found, fmt.Sprintf("%d %s", pid, cmdline))
			}
		}
	}
	return found
}

// demoHost finds the host the demo announced for a registry.
func demoHost(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s+` + name + `\s+(127\.0\.0\.1:\d+)\s`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("demo named no %s host:\n%s", name, out)
	}
	return m[1]
}

// demoSteps splits the output at the numbered headings: steps[n] is step n.
func demoSteps(t *testing.T, out string) map[int]string {
	t.Helper()
	heading := regexp.MustCompile(`(?m)^==> (?:\x1b\[1m)?(\d)/5 `)
	idx := heading.FindAllStringSubmatchIndex(out, -1)
	steps := map[int]string{}
	for i, m := range idx {
		end := len(out)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		n, _ := strconv.Atoi(out[m[2]:m[3]])
		steps[n] = out[m[0]:end]
	}
	if len(steps) != 5 {
		t.Fatalf("want steps 1 to 5, found %d:\n%s", len(steps), out)
	}
	return steps
}

// pullsListings returns the tables printed by each `pullctl pulls` in s.
func pullsListings(s string) []string {
	var tables []string
	for _, part := range strings.Split(s, "$ pullctl pulls\n")[1:] {
		var rows []string
		for _, l := range strings.Split(part, "\n") {
			if strings.HasPrefix(l, " ") || strings.HasPrefix(l, "$") || l == "" {
				break
			}
			rows = append(rows, l)
		}
		tables = append(tables, strings.Join(rows, "\n"))
	}
	return tables
}

func stateCount(table, state string) int {
	return len(regexp.MustCompile(`(?m)\s`+state+`\s`).FindAllString(table, -1))
}
