package kubelet

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// TestKubelet runs one kubelet on one Pullwise containerd for the
// behaviours that need nothing else of the node, in order: each subtest
// leaves its pods running, and the last restarts containerd under all of
// them. Starting a node takes seconds; sharing it keeps `make test` short.
// platformConfigs are CRI image configs the big platforms ship besides
// the default; each sends stock CRI down its local pull path.
var platformConfigs = []struct{ name, criImages string }{
	{name: "default"},
	{name: "EKS-shaped", criImages: "  discard_unpacked_layers = true\n"},
	{name: "RKE2-shaped", criImages: "  use_local_image_pull = true\n"},
}

// TestKubelet runs on each of platformConfigs: the features hold on all.
func TestKubelet(t *testing.T) {
	for _, c := range platformConfigs {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t, nodeOptions{criImages: c.criImages})
			t.Run("PullSource", func(t *testing.T) { testPullSource(t, n) })
			t.Run("Progress", func(t *testing.T) { testProgress(t, n) })
			t.Run("IfNewerNotPresent", func(t *testing.T) { testIfNewerNotPresent(t, n) })
			t.Run("ContainerdRestart", func(t *testing.T) { testContainerdRestart(t, n) })
		})
	}
}

// testPullSource: a static pod whose image comes through the mirror
// reaches Running, and its container carries the mirror as pull source in
// CRI's verbose status, its label and pullctl inspect; the image in the
// store carries it too.
func testPullSource(t *testing.T, n *node) {
	n.t = t
	app := n.push("kube/app", "v1", runnableImage(t, 10))
	n.k.WritePod(t, StaticPod{Name: "source", Image: app.Ref})
	pod := n.k.AwaitRunning(t, "source", podTimeout)

	want := n.mirror.Host() + "/kube/app:v1"
	c := pod.Status.ContainerStatuses[0]
	if !strings.HasSuffix(c.ImageID, app.Digest.String()) {
		t.Errorf("kubelet reports imageID %q, want the pushed manifest %s", c.ImageID, app.Digest)
	}
	st := n.containerStatus(c.CRIID())
	if got := st.GetInfo()["imagePullSource"]; got != want {
		t.Errorf("CRI verbose ContainerStatus imagePullSource = %q, want %q", got, want)
	}
	if got := st.GetStatus().GetLabels()["io.pullwise.image-pull-source"]; got != want {
		t.Errorf("container label io.pullwise.image-pull-source = %q, want %q", got, want)
	}
	out, err := n.pullctl("inspect", "-o", "json", c.CRIID())
	var v struct {
		Status struct {
			ImagePullSource string `json:"imagePullSource"`
		} `json:"status"`
	}
	if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Status.ImagePullSource != want {
		t.Errorf("pullctl inspect -o json: want imagePullSource %q (err %v):\n%s", want, err, out)
	}
	if got := n.imageStatus(app.Ref).GetInfo()["pullSource"]; got != want {
		t.Errorf("CRI verbose ImageStatus pullSource = %q, want %q", got, want)
	}
	img, err := n.pw.ImageStatus(context.Background(), &api.ImageStatusRequest{Image: &criapi.ImageSpec{Image: app.Ref}})
	if err != nil || img.GetPullSource() != want {
		t.Errorf("Pullwise ImageStatus pull_source = %q (%v), want %q", img.GetPullSource(), err, want)
	}
	// The mirror, not upstream, served kubelet's pull: its manifest and
	// every layer (upstream saw only the mirror filling its cache).
	if got := served(n.mirror, "kube/app", registry.KindManifest, "GET", 200); got == 0 {
		t.Errorf("the mirror served no manifest of kube/app: %v", n.mirror.Requests())
	}
	for _, l := range app.Layers {
		if n.mirror.Count(func(r registry.Request) bool { return strings.HasSuffix(r.Path, l.String()) && r.Status == 200 }) == 0 {
			t.Errorf("the mirror did not serve layer %s", l)
		}
	}
}

// progressLine is one line of the NDJSON progress stream.
type progressLine struct {
	Image    string `json:"image"`
	Layer    string `json:"layer"`
	Progress int64  `json:"progress"`
	Total    int64  `json:"total"`
	Error    string `json:"error"`
}

// testProgress: while kubelet pulls a throttled image for a static pod,
// `pullctl progress POD_ID` streams that pod's layers to completion and
// exits 0; the pod then runs.
func testProgress(t *testing.T, n *node) {
	n.t = t
	slow := n.push("kube/slow", "v1", runnableImage(t, 20, 512<<10, 512<<10))
	// The two data layers trickle from the mirror at 256 KiB/s each, so
	// the pull lasts about 2 s: pullctl, started once the sandbox exists,
	// joins it well before its end. (The /pause layer is on the node
	// already: every test image shares it.)
	n.mirror.SetFault(registry.When(func(r registry.Request) bool {
		return r.Repo == "kube/slow" && r.Kind == registry.KindBlob
	}, &registry.Fault{BytesPerSecond: 256 << 10}))
	t.Cleanup(func() { n.mirror.SetFault(nil) })

	n.k.WritePod(t, StaticPod{Name: "progress", Image: slow.Ref})
	// kubelet runs the sandbox first, then pulls the container's image
	// with the sandbox's config: the pod's ID is known before its pull.
	var podID string
	deadline := time.Now().Add(podTimeout)
	for {
		id, ok := n.sandboxOf("progress")
		if ok {
			podID = id
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sandbox for the pod after %s:\n%s", podTimeout, n.k.LogTail(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	out, err := n.pullctl("progress", "-o", "json", podID)
	if err != nil {
		t.Fatalf("pullctl progress %s: %v\n%s", podID, err, out)
	}
	var lines []progressLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var pl progressLine
		if err := json.Unmarshal([]byte(l), &pl); err != nil {
			t.Fatalf("pullctl progress printed %q, not NDJSON: %v", l, err)
		}
		if pl.Image != slow.Ref {
			t.Errorf("the pod's stream shows another image: %q", l)
		}
		lines = append(lines, pl)
	}
	done, inFlight := map[string]bool{}, false
	for _, l := range lines {
		if l.Layer != "" && l.Total > 0 && l.Progress == l.Total {
			done[l.Layer] = true
		}
		if l.Progress < l.Total {
			inFlight = true
		}
	}
	for _, d := range slow.Layers {
		if !done[d.String()] {
			t.Errorf("layer %s never reached its total in the stream:\n%s", d, out)
		}
	}
	if !inFlight {
		t.Errorf("the stream never showed the pull in flight, only its end:\n%s", out)
	}
	last := lines[len(lines)-1]
	if last.Layer != "" || last.Error != "" || last.Total != slow.LayerBytes() || last.Progress != last.Total {
		t.Errorf("the stream ends with %+v, want the image line complete at %d bytes", last, slow.LayerBytes())
	}
	n.k.AwaitRunning(t, "progress", podTimeout)
}

// testIfNewerNotPresent: a pod with imagePullPolicy Always and the
// annotation pullwise.io/image-pull-policy: IfNewerNotPresent restarts its
// container from the local image while the registries are down, where the
// same pod without the annotation is stuck in an image pull error; once
// the tag is re-pushed, the new digest is pulled and run.
func testIfNewerNotPresent(t *testing.T, n *node) {
	n.t = t
	v1 := n.push("kube/fresh", "v1", runnableImage(t, 30))
	ifNewer := map[string]string{"pullwise.io/image-pull-policy": "IfNewerNotPresent"}
	n.k.WritePod(t, StaticPod{Name: "ifnewer", Image: v1.Ref, PullPolicy: "Always", Annotations: ifNewer})
	n.k.WritePod(t, StaticPod{Name: "always", Image: v1.Ref, PullPolicy: "Always"})
	first := n.k.AwaitRunning(t, "ifnewer", podTimeout).Status.ContainerStatuses[0]
	control := n.k.AwaitRunning(t, "always", podTimeout).Status.ContainerStatuses[0]

	n.down(true)
	t.Cleanup(func() { n.down(false) })
	n.stopContainer(first.CRIID())
	n.stopContainer(control.CRIID())
	restarted := n.k.AwaitPod(t, "ifnewer", podTimeout, "container restarted and running", func(p Pod) bool {
		return Running(p) && p.Status.ContainerStatuses[0].CRIID() != first.CRIID()
	}).Status.ContainerStatuses[0]
	if restarted.ImageID != first.ImageID {
		t.Errorf("restarted from %s, want the local %s", restarted.ImageID, first.ImageID)
	}
	// kubelet did ask (Always): the check reached the registries, which
	// refused it.
	if got := n.mirror.Count(func(r registry.Request) bool { return r.Repo == "kube/fresh" && r.Status == 503 }); got == 0 {
		t.Errorf("no request for kube/fresh reached the mirror while it was down: %v", n.mirror.Requests())
	}
	failed := n.k.AwaitPod(t, "always", podTimeout, "an image pull error", func(p Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff")
	}).Status.ContainerStatuses[0]
	t.Logf("without the annotation, kubelet reports: %s: %s", failed.State.Waiting.Reason, failed.State.Waiting.Message)
	n.k.RemovePod(t, "always")

	n.down(false)
	v2 := n.push("kube/fresh", "v1", runnableImage(t, 31))
	n.stopContainer(restarted.CRIID())
	n.k.AwaitPod(t, "ifnewer", podTimeout, "running the re-pushed digest", func(p Pod) bool {
		return Running(p) && strings.HasSuffix(p.Status.ContainerStatuses[0].ImageID, v2.Digest.String())
	})
	// The mirror failed moments ago, so the node may still skip it for its
	// cooldown (docs/registry-health.md) and ask upstream itself. Requests
	// the pull-through mirror makes to upstream do not count: containerd
	// must have fetched the manifest from one of them.
	fetched := 0
	for _, r := range []*registry.Registry{n.mirror, n.upstream} {
		_ = r.WaitIdle(context.Background())
		fetched += r.Count(func(req registry.Request) bool {
			return req.Repo == "kube/fresh" && req.Kind == registry.KindManifest && req.Method == "GET" && req.Status == 200 &&
				strings.HasPrefix(req.Header.Get("User-Agent"), "containerd")
		})
	}
	if fetched == 0 {
		t.Errorf("containerd fetched the new manifest from neither registry: mirror %v, upstream %v", n.mirror.Requests(), n.upstream.Requests())
	}
	n.k.AwaitGone(t, "always", podTimeout)
}

// testContainerdRestart: containerd restarts under running pods; kubelet
// reconnects (a new pod starts), the pods keep their containers, and pull
// sources and pins are intact.
func testContainerdRestart(t *testing.T, n *node) {
	n.t = t
	type before struct {
		id, source string
		restarts   int
	}
	pods, err := n.k.Pods()
	if err != nil {
		t.Fatal(err)
	}
	running := map[string]before{}
	for _, p := range pods {
		if !Running(p) {
			t.Fatalf("pod %s not running before the restart: %+v", p.Metadata.Name, p.Status)
		}
		c := p.Status.ContainerStatuses[0]
		running[p.Metadata.Name] = before{id: c.CRIID(), source: n.containerStatus(c.CRIID()).GetInfo()["imagePullSource"], restarts: c.RestartCount}
	}
	if len(running) < 3 {
		t.Fatalf("want the earlier subtests' pods running, got %d", len(running))
	}
	appRef := n.upHost + "/kube/app:v1"
	appSource := n.imageStatus(appRef).GetInfo()["pullSource"]
	if appSource == "" {
		t.Fatalf("%s has no pull source before the restart", appRef)
	}

	n.d.Restart(t)

	after := n.push("kube/after", "v1", runnableImage(t, 60))
	n.k.WritePod(t, StaticPod{Name: "after", Image: after.Ref})
	n.k.AwaitRunning(t, "after", podTimeout)
	for name, b := range running {
		p, ok := n.k.Pod(t, strings.TrimSuffix(name, "-"+NodeName))
		if !ok || !Running(p) {
			t.Errorf("pod %s not running after the restart: %+v", name, p.Status)
			continue
		}
		c := p.Status.ContainerStatuses[0]
		if c.CRIID() != b.id || c.RestartCount != b.restarts {
			t.Errorf("pod %s: container %s (restarts %d) before, %s (restarts %d) after", name, b.id, b.restarts, c.CRIID(), c.RestartCount)
		}
		st := n.containerStatus(b.id)
		if st.GetStatus().GetState() != criapi.ContainerState_CONTAINER_RUNNING {
			t.Errorf("container %s is %s after the restart", b.id, st.GetStatus().GetState())
		}
		if got := st.GetInfo()["imagePullSource"]; got != b.source || got == "" {
			t.Errorf("container %s pull source %q before, %q after", b.id, b.source, got)
		}
	}
	if got := n.imageStatus(appRef).GetInfo()["pullSource"]; got != appSource {
		t.Errorf("%s pull source %q before the restart, %q after", appRef, appSource, got)
	}
	pause := n.imageStatus(n.pause.Ref).GetImage()
	if !pause.GetPinned() {
		t.Errorf("the sandbox image is not pinned after the restart: %v", pause)
	}
	out, err := exec.Command(daemon.Bin("ctr"), "-a", n.d.Socket, "-n", "k8s.io", "images", "ls", "name=="+n.pause.Ref).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "io.cri-containerd.pinned=pinned") || !strings.Contains(string(out), "io.pullwise.pinned-by=config") {
		t.Errorf("the sandbox image's record lacks its pin labels (err %v):\n%s", err, out)
	}
}
