package integration

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/pullwise/pullwise/integration/daemon"
)

// buildVersion is what one containerd binary says of itself.
type buildVersion struct {
	pkg, runtime, revision string
}

// containerdVersion runs `containerd --version`: "containerd PACKAGE
// VERSION REVISION", as upstream prints it.
func containerdVersion(t *testing.T, bin string) buildVersion {
	t.Helper()
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	f := strings.Fields(string(out))
	if len(f) != 4 || f[0] != "containerd" {
		t.Fatalf("%s --version printed %q, want containerd PACKAGE VERSION REVISION", bin, out)
	}
	return buildVersion{pkg: f[1], runtime: f[2], revision: f[3]}
}

// requireVersionEverywhere checks that the running daemon's CRI
// RuntimeVersion and `pullctl version` (the binary given) say what
// `containerd --version` says, and that each names the upstream release,
// the Pullwise version and the commit of this checkout.
func requireVersionEverywhere(t *testing.T, e *env, containerd, pullctl string) {
	t.Helper()
	upstream := output(t, "go", "list", "-m", "-f", "{{.Version}}", "github.com/containerd/containerd/v2")
	head := output(t, "git", "rev-parse", "HEAD")

	v := containerdVersion(t, containerd)
	if v.pkg != "github.com/pullwise/pullwise" {
		t.Errorf("containerd --version names package %q", v.pkg)
	}
	if !strings.HasPrefix(v.runtime, upstream+"+pullwise.") || !strings.Contains(v.runtime, head[:7]) {
		t.Errorf("containerd --version says %q: want %s+pullwise.<version> naming commit %s", v.runtime, upstream, head[:7])
	}
	if !strings.HasPrefix(v.revision, head) {
		t.Errorf("containerd --version names revision %q, want %s", v.revision, head)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cri, err := e.runtime.Version(ctx, "v1")
	if err != nil {
		t.Fatalf("CRI Version: %v", err)
	}
	if cri.GetRuntimeVersion() != v.runtime {
		t.Errorf("CRI RuntimeVersion = %q, containerd --version says %q", cri.GetRuntimeVersion(), v.runtime)
	}
	// Parsed as kubelet parses it for the node's containerRuntimeVersion.
	if sv, err := utilversion.ParseSemantic(cri.GetRuntimeVersion()); err != nil || "v"+sv.String() != v.runtime {
		t.Errorf("kubelet parses RuntimeVersion %q as %v (%v)", cri.GetRuntimeVersion(), sv, err)
	}

	// containerd's own metric, registered before any Pullwise code runs.
	if got := e.metric(fmt.Sprintf(`containerd_build_info_total{revision=%q,version=%q}`, v.revision, v.runtime)); got != 1 {
		t.Errorf("containerd_build_info_total for %+v = %v, want 1", v, got)
	}

	out, err := exec.Command(pullctl, "-r", e.d.Endpoint(), "version", "-o", "json").CombinedOutput()
	if err != nil {
		t.Fatalf("pullctl version: %v\n%s", err, out)
	}
	var pv struct {
		RuntimeVersion  string `json:"runtimeVersion"`
		PullwiseVersion string `json:"pullwiseVersion"`
		Commit          string `json:"commit"`
		UpstreamVersion string `json:"upstreamVersion"`
		PullctlVersion  string `json:"pullctlVersion"`
	}
	if err := json.Unmarshal(out, &pv); err != nil {
		t.Fatalf("pullctl version -o json: %v\n%s", err, out)
	}
	if pv.RuntimeVersion != v.runtime || pv.Commit != v.revision || pv.UpstreamVersion != upstream ||
		pv.PullwiseVersion == "" || !strings.Contains(v.runtime, "+pullwise."+pv.PullwiseVersion) ||
		!strings.HasPrefix(pv.PullctlVersion, pv.PullwiseVersion+" (commit "+head) {
		t.Errorf("pullctl version says %+v; containerd --version says %+v, upstream %s, HEAD %s", pv, v, upstream, head)
	}
}

// output runs a command of the developer's tools (go, git) in this
// checkout and returns what it printed, trimmed.
func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// TestVersionNamesTheBuild: the three places an operator reads the version
// (containerd --version, CRI RuntimeVersion as crictl and kubelet show it,
// pullctl version) agree, and name the upstream containerd release, the
// Pullwise version and the commit.
func TestVersionNamesTheBuild(t *testing.T) {
	e := newEnv(t, envOptions{})
	requireVersionEverywhere(t, e, daemon.Bin("containerd"), daemon.Bin("pullctl"))
}

// releaseEntries is what the tarball holds, in the order it holds it.
var releaseEntries = []string{
	"bin/", "bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr", "bin/pullctl",
	"etc/", "etc/containerd/", "etc/containerd/config.toml",
	"etc/systemd/", "etc/systemd/system/", "etc/systemd/system/containerd.service",
}

// TestReleaseTarball installs the tarball `make release` built
// (PULLWISE_RELEASE, set by `make integration`) as an operator does,
// into a temporary prefix, and runs a pod on the daemon it holds.
func TestReleaseTarball(t *testing.T) {
	tarball := os.Getenv("PULLWISE_RELEASE")
	if tarball == "" {
		t.Fatal("PULLWISE_RELEASE is not set: run this through `make integration`, which builds the release first")
	}

	// The checksum file verifies as the docs say to verify it.
	check := exec.Command("sha256sum", "-c", filepath.Base(tarball)+".sha256sum")
	check.Dir = filepath.Dir(tarball)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, out)
	}

	// The entries are containerd's release shape, owned by root, with one
	// date: what makes two builds of one commit the same bytes.
	var names []string
	var dates []time.Time
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		if !slices.ContainsFunc(dates, h.ModTime.Equal) {
			dates = append(dates, h.ModTime)
		}
	}
	if !slices.Equal(names, releaseEntries) {
		t.Fatalf("tarball holds %q, want %q", names, releaseEntries)
	}
	if len(dates) != 1 {
		t.Errorf("entries carry %d dates, want one: %v", len(dates), dates)
	}

	// Installed as operations.md says: extracted into the prefix.
	prefix := t.TempDir()
	if out, err := exec.Command("tar", "-C", prefix, "-xzf", tarball).CombinedOutput(); err != nil {
		t.Fatalf("tar -xzf: %v\n%s", err, out)
	}
	bin := filepath.Join(prefix, "bin")
	for _, name := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "pullctl"} {
		out, err := exec.Command("ldd", filepath.Join(bin, name)).CombinedOutput()
		if strings.Contains(string(out), "libdeflate") {
			t.Errorf("%s links libdeflate dynamically:\n%s", name, out)
		}
		// Only containerd links (glibc) dynamically, as upstream's does.
		static := err != nil && strings.Contains(string(out), "not a dynamic executable")
		if static != (name != "containerd") {
			t.Errorf("ldd %s (static=%v):\n%s", name, static, out)
		}
	}
	// ctr and the shim carry the version the daemon reports.
	want := containerdVersion(t, filepath.Join(bin, "containerd"))
	if dev := containerdVersion(t, daemon.Bin("containerd")); dev != want {
		t.Errorf("the release's containerd says %+v, bin/containerd %+v", want, dev)
	}
	if out, err := exec.Command(filepath.Join(bin, "ctr"), "--version").CombinedOutput(); err != nil ||
		strings.TrimSpace(string(out)) != "ctr "+want.pkg+" "+want.runtime {
		t.Errorf("ctr --version: %q (%v), want ctr %s %s", out, err, want.pkg, want.runtime)
	}
	if out, err := exec.Command(filepath.Join(bin, "containerd-shim-runc-v2"), "-v").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), want.runtime) || !strings.Contains(string(out), want.revision) {
		t.Errorf("containerd-shim-runc-v2 -v: %v\n%s", err, out)
	}

	// The installed daemon starts, reports its version everywhere, and runs
	// a pod and a container with the installed shim: the daemon finds it
	// beside itself, first in its PATH.
	e, _ := newPodEnv(t, envOptions{binary: filepath.Join(bin, "containerd")})
	requireVersionEverywhere(t, e, filepath.Join(bin, "containerd"), filepath.Join(bin, "pullctl"))
	img := e.pushRunnable("release/app", "v1", 61)
	if _, err := e.images.PullImage(context.Background(), criImage(img.Ref), nil, nil); err != nil {
		t.Fatalf("PullImage %s: %v", img.Ref, err)
	}
	podID, podCfg := e.runPod(t, "release")
	ctr := e.createContainer(t, podID, podCfg, "app", img.Ref)
	e.startContainer(t, ctr)
	if pids := shimPIDs(e.d.Socket); len(pids) == 0 {
		t.Fatal("no shim runs for the pod")
	} else if exe, err := os.Readlink("/proc/" + strconv.Itoa(pids[0]) + "/exe"); err != nil || exe != filepath.Join(bin, "containerd-shim-runc-v2") {
		t.Errorf("the pod's shim is %q (%v), want the installed one", exe, err)
	}
}

// TestMakeInstall: `make install` puts the release's binaries under PREFIX
// and a unit that starts them, and installs the example config only where
// a node has none: an operator's config.toml is never overwritten.
func TestMakeInstall(t *testing.T) {
	example, err := os.ReadFile("../contrib/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		existing string // the node's config.toml before, none when empty
	}{
		{name: "fresh node"},
		{name: "node with a config", existing: "version = 3\n# the operator's own\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dest := t.TempDir()
			config := filepath.Join(dest, "etc/containerd/config.toml")
			if tc.existing != "" {
				if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(config, []byte(tc.existing), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command("make", "-s", "-C", "..", "install", "DESTDIR="+dest, "PREFIX=/usr")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("make install: %v\n%s", err, out)
			}
			for _, name := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "pullctl"} {
				if fi, err := os.Stat(filepath.Join(dest, "usr/bin", name)); err != nil || fi.Mode().Perm() != 0o755 {
					t.Errorf("usr/bin/%s: %v, %v", name, fi, err)
				}
			}
			unit, err := os.ReadFile(filepath.Join(dest, "usr/lib/systemd/system/containerd.service"))
			if err != nil || !strings.Contains(string(unit), "\nExecStart=/usr/bin/containerd --config /etc/containerd/config.toml\n") {
				t.Errorf("the unit does not start /usr/bin/containerd (%v):\n%s", err, unit)
			}
			got, err := os.ReadFile(config)
			if err != nil {
				t.Fatal(err)
			}
			want := string(example)
			if tc.existing != "" {
				want = tc.existing
			}
			if string(got) != want {
				t.Errorf("config.toml after make install:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
