package cripull

import (
	"context"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// The snapshotter a CRI pull unpacks into is CRI's choice, case by case as
// in containerd v2.4.2's snapshotterFromPodSandboxConfig.
func TestSnapshotterAsCRIChooses(t *testing.T) {
	p := &Puller{deps: Deps{Config: criconfig.Images{
		Snapshotter:      "overlayfs",
		RuntimePlatforms: map[string]criconfig.ImagePlatform{"lazy": {Snapshotter: "stargz"}, "plain": {}},
	}}}
	sandbox := &runtime.PodSandboxConfig{}
	annotated := &runtime.PodSandboxConfig{Annotations: map[string]string{runtimeHandlerAnnotation: "lazy"}}
	for _, tc := range []struct {
		name    string
		handler string
		sandbox *runtime.PodSandboxConfig
		want    string
	}{
		{name: "no handler", sandbox: sandbox, want: "overlayfs"},
		{name: "handler with a snapshotter", handler: "lazy", sandbox: sandbox, want: "stargz"},
		{name: "handler without one", handler: "plain", sandbox: sandbox, want: "overlayfs"},
		{name: "unknown handler", handler: "other", sandbox: sandbox, want: "overlayfs"},
		{name: "handler from the deprecated annotation", sandbox: annotated, want: "stargz"},
		{name: "request's handler before the annotation", handler: "plain", sandbox: annotated, want: "overlayfs"},
		// crictl pull --runtime-handler without a pod: CRI ignores it.
		{name: "handler without a sandbox config", handler: "lazy", want: "overlayfs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: "example.com/a:1", RuntimeHandler: tc.handler}, SandboxConfig: tc.sandbox}
			if got := p.snapshotter(context.Background(), "example.com/a:1", r); got != tc.want {
				t.Errorf("snapshotter = %q, want %q", got, tc.want)
			}
		})
	}
}
