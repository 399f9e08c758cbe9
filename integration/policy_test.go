package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/integration/registry"
)

func (e *env) pwPull(ref string, p api.PullPolicy) (*api.PullImageResponse, error) {
	return e.pullwise.PullImage(context.Background(), &api.PullImageRequest{Image: criImage(ref), PullPolicy: p})
}

// registryDown points hosts.toml for upstream at an address nothing
// listens on: every connection is refused.
func (e *env) registryDown() {
	e.t.Helper()
	hosts := fmt.Sprintf("server = %q\n", "http://"+freeLoopback(e.t))
	if err := os.WriteFile(filepath.Join(e.hostsDir, e.upstream.Host(), "hosts.toml"), []byte(hosts), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) requests(filter func(registry.Request) bool) int {
	e.t.Helper()
	if err := e.upstream.WaitIdle(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	return e.upstream.Count(filter)
}

func isManifestHead(r registry.Request) bool {
	return r.Kind == registry.KindManifest && r.Method == "HEAD"
}
func isGet(r registry.Request) bool { return r.Method == "GET" }

func TestIfNewerNotPresent(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("newer/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 900})
	const inp = api.PullPolicy_IF_NEWER_NOT_PRESENT

	// Not present: pulled.
	resp, err := e.pwPull(img.Ref, inp)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetPulled() || resp.GetReason() != "not-present" || resp.GetImageRef() != img.Config.String() {
		t.Fatalf("first pull: %v", resp)
	}
	if resp.GetPullSource() != e.upstream.Host()+"/newer/app:v1" {
		t.Fatalf("pull source %q", resp.GetPullSource())
	}

	// Present, same digest: one HEAD, nothing else.
	e.upstream.Reset()
	resp, err = e.pwPull(img.Ref, inp)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetPulled() || resp.GetReason() != "up-to-date" || resp.GetLocalDigest() != img.Digest.String() || resp.GetRemoteDigest() != img.Digest.String() {
		t.Fatalf("unchanged: %v", resp)
	}
	if n, all := e.requests(isManifestHead), e.requests(func(registry.Request) bool { return true }); n != 1 || all != 1 {
		t.Fatalf("unchanged image cost %d requests (%d HEADs), want exactly 1 HEAD", all, n)
	}

	// Tag moved: pulled, new digest.
	moved := e.upstream.Push(t, "newer/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 901})
	resp, err = e.pwPull(img.Ref, inp)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetPulled() || resp.GetReason() != "remote-changed" || resp.GetRemoteDigest() != moved.Digest.String() ||
		resp.GetLocalDigest() != img.Digest.String() || resp.GetImageRef() != moved.Config.String() {
		t.Fatalf("moved: %v", resp)
	}

	// A digest reference: nothing to check.
	e.upstream.Reset()
	resp, err = e.pwPull(digestRef(e.upstream.Host(), "newer/app", moved), inp)
	if err != nil || resp.GetPulled() || resp.GetReason() != "up-to-date" {
		t.Fatalf("digest reference: %v %v", resp, err)
	}
	if n := e.requests(func(registry.Request) bool { return true }); n != 0 {
		t.Fatalf("digest reference present cost %d requests", n)
	}

	// Registry down: the local image, with a warning.
	e.registryDown()
	resp, err = e.pwPull(img.Ref, inp)
	if err != nil {
		t.Fatalf("registry down: %v", err)
	}
	if resp.GetPulled() || resp.GetReason() != "registry-unavailable-used-local" || resp.GetImageRef() != moved.Config.String() ||
		len(resp.GetWarnings()) != 1 || !strings.Contains(resp.GetWarnings()[0], "registry unavailable") {
		t.Fatalf("registry down: %v", resp)
	}
	if !strings.Contains(e.d.Log(), "registry unavailable, using the local image") {
		t.Fatal("no warning in containerd's log")
	}
}

func TestIfNewerNotPresentNewPullSource(t *testing.T) {
	e := newEnv(t, envOptions{mirror: mirrorSeeded})
	img := e.push("newer/src", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 905})
	resp, err := e.pwPull(img.Ref, api.PullPolicy_IF_NEWER_NOT_PRESENT)
	if err != nil || resp.GetPullSource() != e.mirror.Host()+"/newer/src:v1" {
		t.Fatalf("first pull: %v %v", resp, err)
	}
	e.setMirror("") // the mirror goes away; the tag moves upstream
	moved := e.upstream.Push(t, "newer/src", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 906})
	resp, err = e.pwPull(img.Ref, api.PullPolicy_IF_NEWER_NOT_PRESENT)
	if err != nil || !resp.GetPulled() || resp.GetPullSource() != e.upstream.Host()+"/newer/src:v1" {
		t.Fatalf("moved: %v %v", resp, err)
	}
	e.assertSource(img.Ref, moved, e.upstream.Host()+"/newer/src:v1")
}

func TestIfNewerNotPresentRetriesThenLocal(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault registry.Fault
	}{
		{"500", registry.Fault{Status: 500}},
		{"429 with Retry-After", registry.Fault{Status: 429, RetryAfter: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			img := e.push("retry/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 910})
			if _, err := e.pwPull(img.Ref, api.PullPolicy_ALWAYS); err != nil {
				t.Fatal(err)
			}
			fault := tc.fault
			e.upstream.SetFault(func(registry.Request) *registry.Fault { return &fault })
			e.upstream.Reset()
			start := time.Now()
			resp, err := e.pwPull(img.Ref, api.PullPolicy_IF_NEWER_NOT_PRESENT)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetReason() != "registry-unavailable-used-local" || resp.GetImageRef() != img.Config.String() || len(resp.GetWarnings()) != 1 {
				t.Fatalf("%v", resp)
			}
			// Retried, but within bounds: two checks, each of which
			// containerd's resolver repeats a few times itself.
			if n := e.requests(isManifestHead); n < 2 || n > 10 {
				t.Fatalf("%d HEADs, want a bounded retry (2 to 10)", n)
			}
			if tc.fault.RetryAfter > 0 && time.Since(start) < time.Second {
				t.Fatalf("the retry did not wait for Retry-After (1s): %s", time.Since(start))
			}
		})
	}
}

func TestIfNewerNotPresentUnauthorizedIsAnError(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("auth/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 920})
	if _, err := e.pwPull(img.Ref, api.PullPolicy_ALWAYS); err != nil {
		t.Fatal(err)
	}
	e.upstream.SetFault(func(registry.Request) *registry.Fault {
		return &registry.Fault{RequireBasicAuth: &registry.BasicAuth{User: "u", Password: "p"}}
	})
	_, err := e.pwPull(img.Ref, api.PullPolicy_IF_NEWER_NOT_PRESENT)
	if code(err) != "Unauthenticated" {
		t.Fatalf("got %v, want Unauthenticated: a local copy must not hide a credentials failure", err)
	}
	// With the right credentials the check passes.
	out, err := e.pullctl("pull", "--policy", "IfNewerNotPresent", "--creds", "u:p", "-o", "json", img.Ref)
	if err != nil || !strings.Contains(out, `"reason": "up-to-date"`) {
		t.Fatalf("pullctl pull with credentials (err %v):\n%s", err, out)
	}
}

func TestPullPolicies(t *testing.T) {
	e := newEnv(t, envOptions{})
	img := e.push("policies/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 930})
	absent := e.push("policies/absent", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 931})

	_, err := e.pwPull(absent.Ref, api.PullPolicy_NEVER)
	if code(err) != "FailedPrecondition" || !strings.Contains(err.Error(), "Never") {
		t.Fatalf("Never, absent: %v", err)
	}
	resp, err := e.pwPull(img.Ref, api.PullPolicy_IF_NOT_PRESENT)
	if err != nil || !resp.GetPulled() || resp.GetReason() != "not-present" {
		t.Fatalf("IfNotPresent, absent: %v %v", resp, err)
	}
	e.upstream.Reset()
	for _, tc := range []struct {
		policy api.PullPolicy
		reason string
		pulled bool
	}{
		{api.PullPolicy_NEVER, "policy-never", false},
		{api.PullPolicy_IF_NOT_PRESENT, "present", false},
	} {
		resp, err := e.pwPull(img.Ref, tc.policy)
		if err != nil || resp.GetPulled() != tc.pulled || resp.GetReason() != tc.reason || resp.GetImageRef() != img.Config.String() {
			t.Fatalf("%v: %v %v", tc.policy, resp, err)
		}
	}
	if n := e.requests(func(registry.Request) bool { return true }); n != 0 {
		t.Fatalf("Never and IfNotPresent on a present image sent %d requests", n)
	}
	resp, err = e.pwPull(img.Ref, api.PullPolicy_ALWAYS)
	if err != nil || !resp.GetPulled() || resp.GetReason() != "policy-always" {
		t.Fatalf("Always: %v %v", resp, err)
	}

	// pullctl's JSON always carries every key, pulled included when false.
	out, err := e.pullctl("pull", "--policy", "IfNotPresent", "-o", "json", img.Ref)
	if err != nil {
		t.Fatalf("pullctl pull: %v\n%s", err, out)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, k := range []string{"imageRef", "pulled", "reason", "localDigest", "remoteDigest", "pullSource", "warnings"} {
		if _, ok := m[k]; !ok {
			t.Errorf("pullctl pull -o json lacks %q:\n%s", k, out)
		}
	}
	if m["pulled"] != false || m["reason"] != "present" {
		t.Fatalf("pullctl pull: %v", m)
	}
}

// TestIfNewerNotPresentThroughCRI covers stock kubelets: the pod
// annotation, which kubelet copies into the ImageSpec, and the node config.
func TestIfNewerNotPresentThroughCRI(t *testing.T) {
	forEachCRIPullConfig(t, testIfNewerNotPresentThroughCRI)
}

func testIfNewerNotPresentThroughCRI(t *testing.T, criImages string) {
	for _, tc := range []struct {
		name        string
		extraConfig string
		annotations map[string]string
	}{
		{name: "pod annotation", annotations: map[string]string{"pullwise.io/image-pull-policy": "IfNewerNotPresent"}},
		{name: "node config", extraConfig: "[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  always_pull_policy = \"IfNewerNotPresent\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{criImages: criImages, extraConfig: tc.extraConfig})
			img := e.push("kubelet/app", "v1", registry.Image{Layers: []int64{16 << 10}, Seed: 940})
			spec := &criapi.ImageSpec{Image: img.Ref, Annotations: tc.annotations}
			ctx := context.Background()
			if _, err := e.images.PullImage(ctx, spec, nil, nil); err != nil {
				t.Fatal(err)
			}
			e.upstream.Reset()
			id, err := e.images.PullImage(ctx, spec, nil, nil)
			if err != nil || id != img.Config.String() {
				t.Fatalf("re-pull: %q %v", id, err)
			}
			if n, gets := e.requests(isManifestHead), e.requests(isGet); n != 1 || gets != 0 {
				t.Fatalf("re-pull sent %d HEADs and %d GETs, want 1 and 0", n, gets)
			}
			// The registry goes down: kubelet's Always pull still succeeds.
			e.registryDown()
			id, err = e.images.PullImage(ctx, spec, nil, nil)
			if err != nil || id != img.Config.String() {
				t.Fatalf("registry down: %q %v", id, err)
			}
			// Without the annotation or config, stock behaviour: the pull fails.
			if tc.annotations != nil {
				if _, err := e.images.PullImage(ctx, criImage(img.Ref), nil, nil); err == nil {
					t.Fatal("a plain Always pull succeeded with the registry down")
				}
			}
		})
	}
}
