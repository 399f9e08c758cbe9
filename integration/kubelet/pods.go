package kubelet

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// StaticPod is a one-container, host-network static pod. Only the fields
// the tests need are modelled; the manifest is written as JSON, which
// kubelet reads like YAML.
type StaticPod struct {
	Name        string
	Image       string
	PullPolicy  string // Always, IfNotPresent or Never; default IfNotPresent
	Annotations map[string]string
}

// manifest renders p as a v1 Pod.
func (p StaticPod) manifest() ([]byte, error) {
	policy := p.PullPolicy
	if policy == "" {
		policy = "IfNotPresent"
	}
	pod := map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata": map[string]any{
			"name":        p.Name,
			"namespace":   "default",
			"annotations": p.Annotations,
		},
		"spec": map[string]any{
			// No CNI here: only host-network pods can start.
			"hostNetwork":   true,
			"restartPolicy": "Always",
			// The test image stops on SIGTERM at once; a short grace
			// period bounds a stuck stop.
			"terminationGracePeriodSeconds": 2,
			"containers": []map[string]any{{
				"name":            "app",
				"image":           p.Image,
				"imagePullPolicy": policy,
			}},
		},
	}
	return json.MarshalIndent(pod, "", "  ")
}

// PodName is the name kubelet gives a static pod: the manifest's name
// suffixed with the node name.
func PodName(name string) string { return name + "-" + NodeName }

// WritePod writes p's manifest; kubelet picks it up through inotify. The
// file is written aside and renamed, so kubelet never reads half of it.
func (k *Kubelet) WritePod(t testing.TB, p StaticPod) {
	t.Helper()
	b, err := p.manifest()
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(k.Dir, p.Name+".json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.ManifestDir, p.Name+".json")); err != nil {
		t.Fatal(err)
	}
}

// RemovePod removes the manifest of pod name; kubelet then stops the pod.
func (k *Kubelet) RemovePod(t testing.TB, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(k.ManifestDir, name+".json")); err != nil {
		t.Fatal(err)
	}
}

// Pod is a pod as kubelet's /pods reports it; only what tests read.
type Pod struct {
	Metadata struct {
		Name        string            `json:"name"`
		Namespace   string            `json:"namespace"`
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
	Status struct {
		Phase             string            `json:"phase"`
		ContainerStatuses []ContainerStatus `json:"containerStatuses"`
	} `json:"status"`
}

// ContainerStatus is one entry of a pod's status.containerStatuses.
type ContainerStatus struct {
	Name         string `json:"name"`
	Ready        bool   `json:"ready"`
	RestartCount int    `json:"restartCount"`
	Image        string `json:"image"`
	ImageID      string `json:"imageID"`
	ContainerID  string `json:"containerID"` // "containerd://<id>"
	State        struct {
		Waiting *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"waiting"`
		Running *struct {
			StartedAt time.Time `json:"startedAt"`
		} `json:"running"`
		Terminated *struct {
			Reason   string `json:"reason"`
			ExitCode int    `json:"exitCode"`
		} `json:"terminated"`
	} `json:"state"`
}

// CRIID is the container's ID in CRI, without the runtime prefix.
func (c ContainerStatus) CRIID() string {
	_, id, _ := strings.Cut(c.ContainerID, "://")
	return id
}

// Pods reads kubelet's read-only /pods.
func (k *Kubelet) Pods() ([]Pod, error) {
	ctx, cancel := callCtx()
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+k.ReadOnlyAddr+"/pods", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /pods: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /pods: %s", resp.Status)
	}
	var list struct {
		Items []Pod `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("decode /pods: %w", err)
	}
	return list.Items, nil
}

// Pod returns the static pod from manifest name, if kubelet knows it.
func (k *Kubelet) Pod(t testing.TB, name string) (Pod, bool) {
	t.Helper()
	pods, err := k.Pods()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Metadata.Name == PodName(name) {
			return p, true
		}
	}
	return Pod{}, false
}

// AwaitPod polls /pods until cond holds for the static pod from manifest
// name, and returns the pod. On timeout the test fails with the pod's last
// state.
func (k *Kubelet) AwaitPod(t testing.TB, name string, timeout time.Duration, what string, cond func(Pod) bool) Pod {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p, ok := k.Pod(t, name)
		if ok && cond(p) {
			return p
		}
		if time.Now().After(deadline) {
			b, _ := json.Marshal(p.Status)
			t.Fatalf("pod %s: timed out after %s waiting for %s; last status (found %v): %s", name, timeout, what, ok, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Running holds when the pod is Running with its container running.
func Running(p Pod) bool {
	if p.Status.Phase != "Running" || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running == nil {
			return false
		}
	}
	return true
}

// AwaitRunning waits until the static pod is Running with its container
// running, and returns it.
func (k *Kubelet) AwaitRunning(t testing.TB, name string, timeout time.Duration) Pod {
	t.Helper()
	return k.AwaitPod(t, name, timeout, "Running", Running)
}

// AwaitGone waits until kubelet no longer lists the static pod.
func (k *Kubelet) AwaitGone(t testing.TB, name string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, ok := k.Pod(t, name); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s still listed by kubelet after %s", name, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeAllPods stops and removes, through CRI, every pod sandbox kubelet
// left in the k8s.io namespace of the containerd at endpoint: kubelet does
// not stop pods when it exits. Stopping a sandbox stops its containers.
func removeAllPods(t testing.TB, endpoint string) {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Errorf("remove pods: %v", err)
		return
	}
	defer conn.Close()
	rt := criapi.NewRuntimeServiceClient(conn)
	ctx, cancel := callCtx()
	defer cancel()
	resp, err := rt.ListPodSandbox(ctx, &criapi.ListPodSandboxRequest{})
	if err != nil {
		t.Errorf("remove pods: ListPodSandbox: %v", err)
		return
	}
	for _, sb := range resp.GetItems() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if _, err := rt.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil && status.Code(err) != codes.NotFound {
			t.Errorf("StopPodSandbox %s: %v", sb.GetId(), err)
		}
		if _, err := rt.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: sb.GetId()}); err != nil && status.Code(err) != codes.NotFound {
			t.Errorf("RemovePodSandbox %s: %v", sb.GetId(), err)
		}
		cancel()
	}
}
