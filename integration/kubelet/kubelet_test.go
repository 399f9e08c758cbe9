package kubelet

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

// TestKubelet runs one kubelet on one Pullwise containerd for the
// behaviours that need nothing else of the node, in order: each subtest
// leaves its pods running, and the last restarts containerd under all of
// them. Starting a node takes seconds; sharing it keeps `make test` short.
func TestKubelet(t *testing.T) {
	n := newNode(t, nodeOptions{})
	t.Run("PullSource", func(t *testing.T) { testPullSource(t, n) })
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
