// Package pullctx holds what a pull's context carries from the API edge
// down to the transfer service: the pod it is for. It is a leaf, so the
// CRI interceptors that set it need nothing of the transfer engine.
package pullctx

import (
	"context"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type podKey struct{}

// WithPod records which pod a pull is for. CRI's PullImage carries the
// pod's sandbox config; the CRI interceptor puts it into the context, which
// flows down to Transfer.
func WithPod(ctx context.Context, pod *runtime.PodSandboxMetadata) context.Context {
	if pod == nil {
		return ctx
	}
	return context.WithValue(ctx, podKey{}, pod)
}

// PodFrom returns the pod a pull is for, or nil when no pod asked for it.
func PodFrom(ctx context.Context) *runtime.PodSandboxMetadata {
	pod, _ := ctx.Value(podKey{}).(*runtime.PodSandboxMetadata)
	return pod
}
