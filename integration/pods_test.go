package integration

// Pods and containers through kubelet's CRI client, fully offline: the
// sandbox (pause) image and container images are built here around a static
// Go program (testdata/pause) and pushed to the loopback registry. Runs
// need runc (Debian's package) and bin/containerd-shim-runc-v2 (`make
// shim`); the daemon harness puts bin/ first in containerd's PATH.

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/integration/daemon"
	"github.com/pullwise/pullwise/integration/registry"
)

// podTimeout bounds each CRI call of the pod helpers; runc and the shim
// answer in well under a second here.
const podTimeout = 30 * time.Second

// runnableImage is a small image whose entrypoint is /pause; seed varies
// its digest.
func runnableImage(t testing.TB, seed int64) registry.Image {
	return registry.Image{
		Layers:     []int64{4 << 10},
		Seed:       seed,
		Files:      map[string][]byte{"/pause": daemon.PauseBinary(t)},
		Entrypoint: []string{"/pause"},
	}
}

// pushRunnable pushes a runnable image (entrypoint /pause) as repo:tag.
func (e *env) pushRunnable(repo, tag string, seed int64) registry.Pushed {
	e.t.Helper()
	return e.push(repo, tag, runnableImage(e.t, seed))
}

// sandboxImageTOML names ref as CRI's sandbox image, for envOptions.criImages.
func sandboxImageTOML(ref string) string {
	return fmt.Sprintf("  [plugins.\"io.containerd.cri.v1.images\".pinned_images]\n    sandbox = %q\n", ref)
}

// newPodEnv is newEnv for tests that run pods. CRI takes the sandbox image
// name from its config, and that name holds the registry's port, known only
// once the registry runs: so the pause image is pushed first and containerd
// restarted with opts plus pinned_images.sandbox naming it. opts.criImages
// must therefore not set pinned_images itself. RunPodSandbox pulls the
// sandbox image from the loopback registry on first use.
//
// It also checks, when the test ends and every pod helper's cleanup has
// run, that no shim of this containerd and no mount under its directory is
// left; leftover shims are then killed with their containers.
func newPodEnv(t *testing.T, opts envOptions) (*env, registry.Pushed) {
	t.Helper()
	e := newEnv(t, opts)
	// Registered after the daemon's own cleanup, so it runs before it: once
	// pods are gone, while containerd still runs.
	t.Cleanup(func() { e.requireNoPodLeftovers(t) })
	pause := e.pushRunnable("pods/pause", "3.10", 9000)
	opts.criImages += sandboxImageTOML(pause.Ref)
	e.restartWith(t, opts)
	return e, pause
}

// hostNetworkPod is a pod config CRI can run here: host network (there is
// no CNI) and no hostname (not allowed with host network), logs under a
// test directory.
func hostNetworkPod(t testing.TB, name string) *criapi.PodSandboxConfig {
	return &criapi.PodSandboxConfig{
		Metadata:     &criapi.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		LogDirectory: t.TempDir(),
		Labels:       map[string]string{"pullwise.test": t.Name()},
		Linux: &criapi.LinuxPodSandboxConfig{SecurityContext: &criapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &criapi.NamespaceOption{Network: criapi.NamespaceMode_NODE},
		}},
	}
}

// runPod runs a host-network pod with the configured sandbox image and
// stops and removes it when the test ends (tolerating a test that already
// did). Stopping a pod also stops its containers.
func (e *env) runPod(t testing.TB, name string) (string, *criapi.PodSandboxConfig) {
	t.Helper()
	cfg := hostNetworkPod(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 2*podTimeout)
	defer cancel()
	id, err := e.runtime.RunPodSandbox(ctx, cfg, "")
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	t.Cleanup(func() { e.removePod(t, id) })
	return id, cfg
}

// removePod stops and removes a pod; a pod already gone is fine.
func (e *env) removePod(t testing.TB, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	if err := e.runtime.StopPodSandbox(ctx, id); err != nil && status.Code(err) != codes.NotFound {
		t.Errorf("StopPodSandbox %s: %v", id, err)
	}
	if err := e.runtime.RemovePodSandbox(ctx, id); err != nil && status.Code(err) != codes.NotFound {
		t.Errorf("RemovePodSandbox %s: %v", id, err)
	}
}

// createContainer creates (does not start) a container running image's
// entrypoint in pod podID, and stops and removes it when the test ends.
// image must be present (pulled) already, as kubelet does; the container
// logs to name.log in the pod's log directory.
func (e *env) createContainer(t testing.TB, podID string, podCfg *criapi.PodSandboxConfig, name, image string) string {
	t.Helper()
	cfg := &criapi.ContainerConfig{
		Metadata: &criapi.ContainerMetadata{Name: name},
		Image:    &criapi.ImageSpec{Image: image, UserSpecifiedImage: image},
		LogPath:  name + ".log",
		Linux:    &criapi.LinuxContainerConfig{},
	}
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	id, err := e.runtime.CreateContainer(ctx, podID, cfg, podCfg)
	if err != nil {
		t.Fatalf("CreateContainer %s in %s: %v", name, podID, err)
	}
	t.Cleanup(func() { e.removeContainer(t, id) })
	return id
}

// removeContainer stops and removes a container; one already gone is fine.
func (e *env) removeContainer(t testing.TB, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	if err := e.runtime.StopContainer(ctx, id, 10); err != nil && status.Code(err) != codes.NotFound {
		t.Errorf("StopContainer %s: %v", id, err)
	}
	if err := e.runtime.RemoveContainer(ctx, id); err != nil && status.Code(err) != codes.NotFound {
		t.Errorf("RemoveContainer %s: %v", id, err)
	}
}

// startContainer starts a created container and waits until CRI reports it
// running.
func (e *env) startContainer(t testing.TB, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	if err := e.runtime.StartContainer(ctx, id); err != nil {
		t.Fatalf("StartContainer %s: %v", id, err)
	}
	e.awaitContainerState(t, id, criapi.ContainerState_CONTAINER_RUNNING)
}

// containerStatus returns CRI's status of a container (not verbose).
func (e *env) containerStatus(t testing.TB, id string) *criapi.ContainerStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	resp, err := e.runtime.ContainerStatus(ctx, id, false)
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	return resp.GetStatus()
}

// awaitContainerState waits until the container is in state.
func (e *env) awaitContainerState(t testing.TB, id string, state criapi.ContainerState) {
	t.Helper()
	eventually(t, podTimeout, fmt.Sprintf("container %s %s", id, state), func() bool {
		return e.containerStatus(t, id).GetState() == state
	})
}

// shimPIDs lists running containerd-shim-runc-v2 processes, those of the
// containerd at address only when address is set (the shim's command line
// carries "-address <socket>").
func shimPIDs(address string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != "containerd-shim-runc-v2" {
			continue
		}
		if address == "" || strings.Contains("\x00"+string(b), "\x00-address\x00"+address+"\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mountsUnder lists mount points at or below dir.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{"read mountinfo: " + err.Error()}
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			points = append(points, f[4])
		}
	}
	return points
}

// requireNoPodLeftovers fails the test when shims of e's containerd or
// mounts under its directory outlive the pods. Shims exit a moment after
// their last task is deleted, so it waits for that first. Leftovers, as
// when containerd died with pods up, are then cleaned up by hand so that
// they do not outlive the test.
func (e *env) requireNoPodLeftovers(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(shimPIDs(e.d.Socket)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if pids := shimPIDs(e.d.Socket); len(pids) > 0 {
		t.Errorf("shims of this containerd still running after the pods were removed: %v; killing them and their containers", pids)
		for _, pid := range pids {
			reapShim(t, pid, e.d.Socket, e.d.Dir)
		}
	}
	if m := mountsUnder(e.d.Dir); len(m) > 0 {
		t.Errorf("mounts left under %s after the pods were removed: %v", e.d.Dir, m)
	}
}

// reapShim force-deletes, with runc, the containers of shim pid whose
// bundles lie under dir (which kills them and removes their cgroups and
// runc state), then kills the shim and removes its sockets. The shim's
// runc root and socket names follow containerd's defaults for the shim
// (/run/containerd/runc/<namespace>, /run/containerd/s/<sha256>).
func reapShim(t testing.TB, pid int, address, dir string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return // gone meanwhile
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	flag := func(name string) string {
		for i := 0; i+1 < len(args); i++ {
			if args[i] == name {
				return args[i+1]
			}
		}
		return ""
	}
	ns, id := flag("-namespace"), flag("-id")
	runcRoot := filepath.Join("/run/containerd/runc", ns)
	out, err := exec.Command("runc", "--root", runcRoot, "list", "--format", "json").Output()
	if err != nil {
		t.Errorf("runc list in %s: %v", runcRoot, err)
	}
	var ctrs []struct {
		ID     string `json:"id"`
		Bundle string `json:"bundle"`
	}
	_ = json.Unmarshal(out, &ctrs)
	for _, c := range ctrs {
		if strings.HasPrefix(c.Bundle, dir+"/") {
			if out, err := exec.Command("runc", "--root", runcRoot, "delete", "--force", c.ID).CombinedOutput(); err != nil {
				t.Errorf("runc delete --force %s: %v: %s", c.ID, err, out)
			}
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kill shim %d: %v", pid, err)
	}
	for _, p := range []string{filepath.Join(address, ns, id), filepath.Join(address, ns, id, "debug")} {
		_ = os.Remove(fmt.Sprintf("/run/containerd/s/%x", sha256.Sum256([]byte(p))))
	}
}

// requireShimCountRestored checks, after everything else of the test has
// been cleaned up (daemon included), that as many shims run as before it.
// Register it first so it runs last.
func requireShimCountRestored(t *testing.T) {
	before := len(shimPIDs(""))
	t.Cleanup(func() {
		if after := shimPIDs(""); len(after) != before {
			t.Errorf("%d containerd-shim-runc-v2 processes before the test, %d after: %v", before, len(after), after)
		}
	})
}

func TestPodAndContainerLifecycle(t *testing.T) {
	requireShimCountRestored(t)
	e, pause := newPodEnv(t, envOptions{})
	app := e.pushRunnable("pods/app", "v1", 9001)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	podID, podCfg := e.runPod(t, "lifecycle")
	pod, err := e.runtime.PodSandboxStatus(ctx, podID, false)
	if err != nil {
		t.Fatalf("PodSandboxStatus: %v", err)
	}
	if got := pod.GetStatus().GetState(); got != criapi.PodSandboxState_SANDBOX_READY {
		t.Fatalf("pod state %s, want SANDBOX_READY", got)
	}
	// The sandbox image came from the loopback registry, pulled by
	// RunPodSandbox.
	if st, err := e.images.ImageStatus(ctx, criImage(pause.Ref), false); err != nil || st.GetImage() == nil {
		t.Fatalf("sandbox image %s not present after RunPodSandbox: %v %v", pause.Ref, st, err)
	} else if st.GetImage().GetId() != pause.Config.String() {
		t.Fatalf("sandbox image id %s, want %s", st.GetImage().GetId(), pause.Config)
	}
	if !servedBlobs(e.upstream, "pods/pause") {
		t.Fatalf("the loopback registry served no blob of the sandbox image: %v", e.upstream.Requests())
	}

	imageRef, err := e.images.PullImage(ctx, criImage(app.Ref), nil, podCfg)
	if err != nil {
		t.Fatalf("PullImage %s: %v", app.Ref, err)
	}
	ctrID := e.createContainer(t, podID, podCfg, "app", imageRef)
	if got := e.containerStatus(t, ctrID).GetState(); got != criapi.ContainerState_CONTAINER_CREATED {
		t.Fatalf("container state %s after create, want CONTAINER_CREATED", got)
	}
	e.startContainer(t, ctrID)
	st := e.containerStatus(t, ctrID)
	if st.GetImageRef() != app.Config.String() && !strings.HasSuffix(st.GetImageRef(), app.Digest.String()) {
		t.Fatalf("container image ref %q, want the app image (%s or %s)", st.GetImageRef(), app.Config, app.Digest)
	}
	// The process really runs: the pause program logs through CRI.
	logPath := filepath.Join(podCfg.LogDirectory, "app.log")
	eventually(t, podTimeout, "container log line", func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "pause: running")
	})
	if len(shimPIDs(e.d.Socket)) == 0 {
		t.Fatal("no shim runs for this containerd with a pod up")
	}

	// Stop and remove both, as kubelet would; the cleanups then find them
	// gone.
	if err := e.runtime.StopContainer(ctx, ctrID, 10); err != nil {
		t.Fatalf("StopContainer: %v", err)
	}
	st = e.containerStatus(t, ctrID)
	if st.GetState() != criapi.ContainerState_CONTAINER_EXITED || st.GetExitCode() != 0 {
		t.Fatalf("after StopContainer: state %s exit code %d, want CONTAINER_EXITED 0 (SIGTERM honoured)", st.GetState(), st.GetExitCode())
	}
	if err := e.runtime.RemoveContainer(ctx, ctrID); err != nil {
		t.Fatalf("RemoveContainer: %v", err)
	}
	if err := e.runtime.StopPodSandbox(ctx, podID); err != nil {
		t.Fatalf("StopPodSandbox: %v", err)
	}
	if err := e.runtime.RemovePodSandbox(ctx, podID); err != nil {
		t.Fatalf("RemovePodSandbox: %v", err)
	}
	pods, err := e.runtime.ListPodSandbox(ctx, nil)
	if err != nil || len(pods) != 0 {
		t.Fatalf("pods after removal: %v %v", pods, err)
	}
	ctrs, err := e.runtime.ListContainers(ctx, nil)
	if err != nil || len(ctrs) != 0 {
		t.Fatalf("containers after removal: %v %v", ctrs, err)
	}
	eventually(t, podTimeout, "shims of this containerd gone", func() bool { return len(shimPIDs(e.d.Socket)) == 0 })
}

// Two pods in one containerd, which restarts while they run: the shims keep
// the pods and containers running, containerd finds them again, and the
// test's cleanup still stops and removes everything.
func TestPodsSurviveContainerdRestart(t *testing.T) {
	requireShimCountRestored(t)
	e, _ := newPodEnv(t, envOptions{})
	app := e.pushRunnable("pods/app", "v1", 9002)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	podA, cfgA := e.runPod(t, "restart-a")
	podB, cfgB := e.runPod(t, "restart-b")
	if podA == podB {
		t.Fatalf("two pods got one id %s", podA)
	}
	imageRef, err := e.images.PullImage(ctx, criImage(app.Ref), nil, cfgA)
	if err != nil {
		t.Fatalf("PullImage: %v", err)
	}
	ctrA := e.createContainer(t, podA, cfgA, "app", imageRef)
	e.startContainer(t, ctrA)
	ctrB := e.createContainer(t, podB, cfgB, "app", imageRef)
	e.startContainer(t, ctrB)
	pidBefore := containerPID(t, e, ctrA)
	shims := shimPIDs(e.d.Socket)

	e.d.Restart(t)

	if got := shimPIDs(e.d.Socket); fmt.Sprint(got) != fmt.Sprint(shims) {
		t.Fatalf("shims %v before the restart, %v after", shims, got)
	}
	for _, id := range []string{ctrA, ctrB} {
		if got := e.containerStatus(t, id).GetState(); got != criapi.ContainerState_CONTAINER_RUNNING {
			t.Fatalf("container %s is %s after the restart, want CONTAINER_RUNNING", id, got)
		}
	}
	if got := containerPID(t, e, ctrA); got != pidBefore {
		t.Fatalf("container pid %d before the restart, %d after: it was restarted", pidBefore, got)
	}
	for _, id := range []string{podA, podB} {
		st, err := e.runtime.PodSandboxStatus(ctx, id, false)
		if err != nil || st.GetStatus().GetState() != criapi.PodSandboxState_SANDBOX_READY {
			t.Fatalf("pod %s after the restart: %v %v", id, st, err)
		}
	}
	// A new container still starts in a recovered pod.
	ctrA2 := e.createContainer(t, podA, cfgA, "app2", imageRef)
	e.startContainer(t, ctrA2)
	// The cleanups stop and remove all of it, through the restarted daemon.
}

// containerPID is the host pid of a running container, from verbose
// ContainerStatus.
func containerPID(t testing.TB, e *env, id string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	resp, err := e.runtime.ContainerStatus(ctx, id, true)
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	var info struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(resp.GetInfo()["info"]), &info); err != nil || info.Pid <= 0 {
		t.Fatalf("no pid in verbose status of %s (%v): %s", id, err, resp.GetInfo()["info"])
	}
	return info.Pid
}

// servedBlobs reports whether r served blobs of repo.
func servedBlobs(r *registry.Registry, repo string) bool {
	for _, req := range r.Requests() {
		if req.Repo == repo && req.Kind == registry.KindBlob && req.Method == "GET" && req.Status == 200 {
			return true
		}
	}
	return false
}
