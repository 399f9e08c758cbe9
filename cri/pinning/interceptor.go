package pinning

import (
	"context"
	"fmt"
	"slices"

	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// CRIImageStatus resolves a CRI image spec to its image the way CRI's
// RemoveImage does (tag, repo@digest, full or truncated image ID, short
// names). Upstream's CRI image service implements it.
type CRIImageStatus interface {
	ImageStatus(context.Context, *runtime.ImageStatusRequest) (*runtime.ImageStatusResponse, error)
}

// RemovalInterceptor refuses the two removals that reach pinned images over
// the API: CRI RemoveImage, which deletes every name of an image, and
// containerd's Images/Delete in CRI's namespace, which ctr uses.
type RemovalInterceptor struct {
	guard *Guard
	cri   CRIImageStatus
}

// NewRemovalInterceptor returns an interceptor that consults guard, and cri
// to learn the names a RemoveImage would delete.
func NewRemovalInterceptor(guard *Guard, cri CRIImageStatus) *RemovalInterceptor {
	return &RemovalInterceptor{guard: guard, cri: cri}
}

// UnaryServerInterceptor refuses removals of pinned images with gRPC
// FailedPrecondition and passes everything else on.
func (i *RemovalInterceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		var err error
		switch r := req.(type) {
		case *runtime.RemoveImageRequest:
			err = i.checkCRIRemoval(ctx, r.GetImage().GetImage())
		case *imagesapi.DeleteImageRequest:
			err = i.checkDelete(ctx, r.GetName())
		}
		if err != nil {
			return nil, errgrpc.ToGRPC(err)
		}
		return handler(ctx, req)
	}
}

func (i *RemovalInterceptor) checkCRIRemoval(ctx context.Context, ref string) error {
	resp, err := i.cri.ImageStatus(ctx, &runtime.ImageStatusRequest{Image: &runtime.ImageSpec{Image: ref}})
	if err != nil {
		return fmt.Errorf("resolve image %q to check whether it is pinned: %w", ref, err)
	}
	img := resp.GetImage()
	if img == nil {
		// Nothing to remove; CRI answers that removal with success.
		return nil
	}
	names := slices.Concat(img.GetRepoTags(), img.GetRepoDigests(), []string{img.GetId()})
	return i.guard.CheckRemoval(ctx, names...)
}

func (i *RemovalInterceptor) checkDelete(ctx context.Context, name string) error {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil || ns != criconfig.Namespace {
		// Without a namespace the images service refuses the request itself.
		return nil
	}
	return i.guard.CheckRemoval(ctx, name)
}
