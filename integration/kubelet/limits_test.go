package kubelet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pullwise/pullwise/integration/registry"
)

// TestKubeletTwoLimits: kubelet's maxParallelImagePulls (3) is above
// Pullwise's node-wide max_parallel_image_pulls (1), with a short
// pull_queue_timeout. Pulls that wait out the timeout in Pullwise's queue
// come back to kubelet as ResourceExhausted; kubelet shows an image pull
// error, backs off, retries, and every pod ends Running with no pull left
// behind.
func TestKubeletTwoLimits(t *testing.T) {
	for _, c := range platformConfigs {
		t.Run(c.name, func(t *testing.T) { testKubeletTwoLimits(t, c.criImages) })
	}
}

func testKubeletTwoLimits(t *testing.T, criImages string) {
	n := newNode(t, nodeOptions{
		criImages: criImages,
		pullwise:  "[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  max_parallel_image_pulls = 1\n  pull_queue_timeout = \"2s\"\n",
		kubelet:   Options{MaxParallelImagePulls: 3},
	})
	const pods = 3
	var refs []string
	for i := range pods {
		refs = append(refs, n.push(fmt.Sprintf("limits/app%d", i), "v1", runnableImage(t, int64(100+i))).Ref)
	}
	// The registry holds every blob of these images until released, so
	// the first pull keeps Pullwise's only slot while the others queue
	// past the timeout. The sandbox image is not held; Pullwise lets it
	// past the limit anyway, as a pod cannot start without it.
	release := n.mirror.HoldBlobs(t, func(repo string) bool { return strings.HasPrefix(repo, "limits/") })
	for i, ref := range refs {
		n.k.WritePod(t, StaticPod{Name: fmt.Sprintf("limits%d", i), Image: ref})
	}

	refused := map[string]string{} // pod -> kubelet's message
	deadline := time.Now().Add(podTimeout)
	for len(refused) < pods-1 {
		if time.Now().After(deadline) {
			t.Fatalf("want %d pods refused with ResourceExhausted within %s, got %v", pods-1, podTimeout, refused)
		}
		for i := range pods {
			name := fmt.Sprintf("limits%d", i)
			p, ok := n.k.Pod(t, name)
			if !ok || len(p.Status.ContainerStatuses) == 0 {
				continue
			}
			if w := p.Status.ContainerStatuses[0].State.Waiting; w != nil && w.Reason == "ErrImagePull" && strings.Contains(w.Message, "ResourceExhausted") {
				refused[name] = w.Message
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := n.mirror.Count(func(r registry.Request) bool {
		return r.Kind == registry.KindBlob && strings.HasPrefix(r.Repo, "limits/")
	}); got != 0 {
		t.Fatalf("blobs served while held: %d", got)
	}
	for name, msg := range refused {
		t.Logf("pod %s: kubelet reports ErrImagePull: %s", name, msg)
	}
	logged := n.k.LogLines("ResourceExhausted")
	if len(logged) == 0 {
		t.Error("kubelet logged nothing about the refused pulls")
	}
	for _, l := range logged[:min(len(logged), 3)] {
		t.Logf("kubelet log: %s", l)
	}

	release()
	for i := range pods {
		n.k.AwaitRunning(t, fmt.Sprintf("limits%d", i), retryTimeout)
	}
	out, err := n.pullctl("pulls")
	if err != nil || strings.Contains(out, "limits/") {
		t.Errorf("pullctl pulls after all pods run (err %v):\n%s", err, out)
	}
	if len(n.listPulls()) != 0 {
		t.Errorf("pulls left after all pods run: %v", n.listPulls())
	}
	// Refused pulls downloaded nothing: in the end every blob of these
	// images crossed the wire exactly once.
	_ = n.mirror.WaitIdle(t.Context())
	perBlob := map[string]int{}
	for _, r := range n.mirror.Requests() {
		if strings.HasPrefix(r.Repo, "limits/") && r.Kind == registry.KindBlob && r.Method == "GET" && r.Status == 200 {
			perBlob[r.Path]++
		}
	}
	if len(perBlob) == 0 {
		t.Error("the mirror served no blob of the images")
	}
	for path, count := range perBlob {
		if count != 1 {
			t.Errorf("%s served %d times, want once", path, count)
		}
	}
}
