package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// TestContainerKeepsPullSource: a container records the source of the
// image it was created from, and keeps it after the image is re-pulled from
// elsewhere and across a containerd restart.
func TestContainerKeepsPullSource(t *testing.T) {
	e, _ := newPodEnv(t, envOptions{mirror: mirrorSeeded})
	app := e.pushRunnable("pods/app", "v1", 9100)
	ctx := context.Background()
	id, err := e.images.PullImage(ctx, criImage(app.Ref), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	fromMirror := e.mirror.Host() + "/pods/app:v1"
	podID, podCfg := e.runPod(t, "source")
	// kubelet creates containers from the image ID PullImage returned.
	ctr := e.createContainer(t, podID, podCfg, "app", id)
	e.requireContainerSource(ctr, fromMirror)

	// The image is re-pulled from upstream (the mirror goes away) after the
	// tag moved: the image's source changes, the container's does not.
	e.setMirror("")
	moved := e.upstream.Push(t, "pods/app", "v1", runnableImage(t, 9101))
	e.criPull(app.Ref)
	e.assertSource(app.Ref, moved, e.upstream.Host()+"/pods/app:v1")
	e.requireContainerSource(ctr, fromMirror)

	e.d.Restart(t)
	e.requireContainerSource(ctr, fromMirror)
}

// requireContainerSource checks the container's source in CRI's verbose
// ContainerStatus, the Pullwise API and pullctl inspect.
func (e *env) requireContainerSource(id, want string) {
	e.t.Helper()
	ctx := context.Background()
	st, err := e.runtime.ContainerStatus(ctx, id, true)
	if err != nil {
		e.t.Fatal(err)
	}
	if got := st.GetInfo()["imagePullSource"]; got != want {
		e.t.Errorf("CRI verbose ContainerStatus imagePullSource = %q, want %q", got, want)
	}
	if got := st.GetStatus().GetLabels()["io.pullwise.image-pull-source"]; got != want {
		e.t.Errorf("container label = %q, want %q", got, want)
	}
	pw, err := e.pullwise.ContainerStatus(ctx, &api.ContainerStatusRequest{ContainerId: id})
	if err != nil || pw.GetImagePullSource() != want {
		e.t.Errorf("Pullwise ContainerStatus: %q %v, want %q", pw.GetImagePullSource(), err, want)
	}
	out, err := e.pullctl("inspect", "-o", "json", id)
	var v struct {
		Status struct {
			ID              string `json:"id"`
			ImagePullSource string `json:"imagePullSource"`
		} `json:"status"`
	}
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Status.ImagePullSource != want || v.Status.ID != id {
		e.t.Errorf("pullctl inspect -o json (err %v):\n%s", err, out)
	}
}

// TestProgressOfPods: a pod's URL streams that pod's pulls and no other's,
// a container's URL its image, and a token issued for one pod gives
// nothing to anyone after its first use.
func TestProgressOfPods(t *testing.T) {
	e, _ := newPodEnv(t, envOptions{})
	mine := e.pushRunnable("pods/mine", "v1", 9200)
	theirs := e.pushRunnable("pods/theirs", "v1", 9201)
	podA, cfgA := e.runPod(t, "a")
	podB, cfgB := e.runPod(t, "b")
	ctx := context.Background()

	urlA := e.progressURL(&api.ImagePullProgressRequest{PodSandboxId: podA})
	urlB := e.progressURL(&api.ImagePullProgressRequest{PodSandboxId: podB})
	linesA := readStream(t, ctx, urlA)
	linesB := readStream(t, ctx, urlB)
	throttleBlobs(e.upstream, 2<<20)
	errs := make(chan error, 2)
	go func() { _, err := e.images.PullImage(ctx, criImage(mine.Ref), nil, cfgA); errs <- err }()
	go func() { _, err := e.images.PullImage(ctx, criImage(theirs.Ref), nil, cfgB); errs <- err }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	check := func(pod string, lines <-chan progressLine, want, other registry.Pushed) {
		var got []progressLine
		for l := range lines {
			if l.Image == other.Ref {
				t.Errorf("pod %s saw the other pod's pull: %+v", pod, l)
			}
			got = append(got, l)
		}
		if len(got) == 0 {
			t.Fatalf("pod %s saw nothing", pod)
		}
		last := got[len(got)-1]
		if last.Image != want.Ref || last.Layer != "" || last.Progress != last.Total || last.Total == 0 {
			t.Fatalf("pod %s stream ended on %+v", pod, last)
		}
		for _, d := range want.Layers {
			if f := lastFor(got, d.String()); f == nil || f.Progress != f.Total {
				t.Fatalf("pod %s: layer %s ended at %+v", pod, d, f)
			}
		}
	}
	check("a", linesA, mine, theirs)
	check("b", linesB, theirs, mine)

	// Used tokens are dead for everyone: pod B replaying A's URL gets 404.
	for _, u := range []string{urlA, urlB} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("replayed URL: %s, want 404", resp.Status)
		}
	}

	// A container's URL: its pod and image.
	ctr := e.createContainer(t, podA, cfgA, "mine", mine.Ref)
	url := e.progressURL(&api.ImagePullProgressRequest{ContainerId: ctr})
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("container progress URL %q", url)
	}
	out, err := e.pullctl("progress", "--print-url", podA)
	if err != nil || !strings.HasPrefix(strings.TrimSpace(out), "http://127.0.0.1:") {
		t.Fatalf("pullctl progress --print-url POD (err %v):\n%s", err, out)
	}
}

// TestPullctlPodProgressOnATerminal: `pullctl progress POD` on a real
// terminal shows each of the pod's images with the sum of its layers and
// one total line for the pod, redrawn in place, and exits 0 when the pod's
// pulls are done.
func TestPullctlPodProgressOnATerminal(t *testing.T) {
	e, _ := newPodEnv(t, envOptions{})
	web := e.push("pod/web", "v1", registry.Image{Layers: []int64{768 << 10, 256 << 10}, Seed: 9700})
	side := e.push("pod/side", "v1", registry.Image{Layers: []int64{1 << 20}, Seed: 9701})
	podID, podCfg := e.runPod(t, "bars")
	throttleBlobs(e.upstream, 192<<10)
	ctx := context.Background()
	errs := make(chan error, 2)
	for _, img := range []registry.Pushed{web, side} {
		go func() { _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, podCfg); errs <- err }()
	}
	eventually(t, 30*time.Second, "both pulls in flight", func() bool { return e.pullsIn("pulling") == 2 })

	term := newTerminal(t, 120, 20, fmt.Sprintf("%s -r %s progress %s", daemon.Bin("pullctl"), e.d.Endpoint(), podID))
	imageLine := func(ref, done string) *regexp.Regexp {
		return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(ref) + `\s+\[[=>-]+\]\s+` + done + ` (KiB|MiB) / 1\.0 MiB`)
	}
	total := regexp.MustCompile(`(?m)^total\s+\[[=>-]+\]\s+\d+\.\d (KiB|MiB) / 2\.0 MiB`)
	var seen string
	eventually(t, time.Minute, "both images and the total part-way", func() bool {
		s := term.screen()
		seen = s
		return imageLine(web.Ref, `\d+\.\d`).MatchString(s) && imageLine(side.Ref, `\d+\.\d`).MatchString(s) &&
			total.MatchString(s) && !strings.Contains(s, "done")
	})
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var final string
	eventually(t, time.Minute, "pullctl progress ends", func() bool {
		final = term.screen()
		return strings.Contains(final, "exit=")
	})
	t.Logf("mid-way:\n%s\nend:\n%s", seen, final)
	if !strings.Contains(final, "exit=0") {
		t.Fatalf("pullctl progress POD did not exit 0:\n%s", final)
	}
	for _, re := range []*regexp.Regexp{
		regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(web.Ref) + `\s+\[=+\]\s+1\.0 MiB / 1\.0 MiB .*done`),
		regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(side.Ref) + `\s+\[=+\]\s+1\.0 MiB / 1\.0 MiB .*done`),
		regexp.MustCompile(`(?m)^total\s+\[=+\]\s+2\.0 MiB / 2\.0 MiB .*done`),
	} {
		if !re.MatchString(final) {
			t.Errorf("the last screen lacks %s", re)
		}
	}
	if n, top := term.scrolled(); n != "0" || !top {
		t.Fatalf("%s lines scrolled off the terminal (first line still on top: %v)", n, top)
	}
}
