package cripull

import (
	"context"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

const (
	pullImageMethod     = "/runtime.v1.ImageService/PullImage"
	runPodSandboxMethod = "/runtime.v1.RuntimeService/RunPodSandbox"
)

// Interceptor serves CRI PullImage with the Puller in place of CRI, whose
// own PullImage would take its local path. It must be the innermost of the
// chain's PullImage interceptors: the others (pod, policy, pull source)
// wrap CRI's pull, and this is that pull.
type Interceptor struct {
	Puller *Puller
}

// UnaryServerInterceptor implements interceptor.Unary.
func (i Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if i.Puller == nil {
			return handler(ctx, req)
		}
		if r, ok := req.(*runtime.RunPodSandboxRequest); ok && info.FullMethod == runPodSandboxMethod {
			// CRI pulls a missing sandbox image itself, in process.
			if err := i.Puller.EnsureSandboxImage(ctx, r.GetConfig(), r.GetRuntimeHandler()); err != nil {
				return nil, errgrpc.ToGRPC(err)
			}
			return handler(ctx, req)
		}
		r, ok := req.(*runtime.PullImageRequest)
		if !ok || info.FullMethod != pullImageMethod {
			return handler(ctx, req)
		}
		resp, err := i.Puller.PullImage(ctx, r)
		if err != nil {
			// As CRI's own service maps its errors.
			return nil, errgrpc.ToGRPC(err)
		}
		return resp, nil
	}
}
