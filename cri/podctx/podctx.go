// Package podctx tells the transfer layer which pod a CRI pull is for. CRI
// PullImage carries the pod's sandbox config, and the gRPC context flows
// from the interceptor down to Transfer, so the pod rides in the context.
package podctx

import (
	"context"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/transfer/pullctx"
)

// PullImageMethod is CRI's PullImage.
const PullImageMethod = "/runtime.v1.ImageService/PullImage"

// Interceptor attaches the pod of a CRI PullImage to its context.
type Interceptor struct{}

// UnaryServerInterceptor implements interceptor.Unary.
func (Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if r, ok := req.(*runtime.PullImageRequest); ok && info.FullMethod == PullImageMethod {
			ctx = pullctx.WithPod(ctx, r.GetSandboxConfig().GetMetadata())
		}
		return handler(ctx, req)
	}
}
