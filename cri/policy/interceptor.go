package policy

import (
	"context"
	"errors"

	remoteserrors "github.com/containerd/containerd/v2/core/remotes/errors"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Annotation selects IfNewerNotPresent for one pod's images. kubelet copies
// pod annotations into the ImageSpec of CRI PullImage.
const Annotation = "pullwise.io/image-pull-policy"

const pullImageMethod = "/runtime.v1.ImageService/PullImage"

// Interceptor applies IfNewerNotPresent to CRI PullImage. kubelet calls
// PullImage only when its own policy says to pull (Always, or an image
// not present), so for those pulls it turns "pull" into "pull if newer".
type Interceptor struct {
	decider *Decider
	// nodeWide applies IfNewerNotPresent to every CRI pull
	// (always_pull_policy = "IfNewerNotPresent").
	nodeWide bool
}

// NewInterceptor returns the CRI PullImage interceptor.
func NewInterceptor(d *Decider, nodeWide bool) *Interceptor {
	return &Interceptor{decider: d, nodeWide: nodeWide}
}

// UnaryServerInterceptor implements interceptor.Unary.
func (i *Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		r, ok := req.(*runtime.PullImageRequest)
		if !ok || info.FullMethod != pullImageMethod || !i.applies(r) {
			return handler(ctx, req)
		}
		d := i.decider.With(func(ctx context.Context, r *runtime.PullImageRequest) (string, error) {
			resp, err := handler(ctx, r)
			if err != nil {
				return "", err
			}
			return resp.(*runtime.PullImageResponse).GetImageRef(), nil
		})
		dec, err := d.Pull(ctx, r, IfNewerNotPresent)
		if err != nil {
			return nil, ToStatus(err)
		}
		return &runtime.PullImageResponse{ImageRef: dec.ImageRef}, nil
	}
}

func (i *Interceptor) applies(r *runtime.PullImageRequest) bool {
	if v, ok := r.GetImage().GetAnnotations()[Annotation]; ok {
		return v == IfNewerNotPresent.String()
	}
	if v, ok := r.GetSandboxConfig().GetAnnotations()[Annotation]; ok {
		return v == IfNewerNotPresent.String()
	}
	return i.nodeWide
}

// ToStatus maps a decision's error to a gRPC status: registry answers keep
// their meaning (401 Unauthenticated, 403 PermissionDenied, 404 NotFound),
// containerd's error kinds map as containerd maps them.
func ToStatus(err error) error {
	var st remoteserrors.ErrUnexpectedStatus
	if errors.As(err, &st) {
		switch st.StatusCode {
		case 401:
			return status.Error(codes.Unauthenticated, err.Error())
		case 403:
			return status.Error(codes.PermissionDenied, err.Error())
		case 404:
			return status.Error(codes.NotFound, err.Error())
		}
	}
	return errgrpc.ToGRPC(err)
}
