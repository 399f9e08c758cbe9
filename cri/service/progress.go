package service

import (
	"context"
	"slices"

	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/distribution/reference"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/transfer/hub"
)

// ProgressIssuer hands out progress stream URLs.
type ProgressIssuer interface {
	Issue(hub.Selector) (string, error)
}

// ImagePullProgress implements api.PullwiseServer (KEP-5334): a URL for
// the progress of a pod's pulls, a container's image pull, or an image.
func (s *Service) ImagePullProgress(ctx context.Context, req *api.ImagePullProgressRequest) (*api.ImagePullProgressResponse, error) {
	if req.GetPodSandboxId() == "" && req.GetContainerId() == "" && req.GetImage() == "" {
		return nil, status.Error(codes.InvalidArgument, "one of pod_sandbox_id, container_id or image is required")
	}
	if s.rt.Progress == nil {
		return nil, status.Error(codes.Unavailable, "the progress server is not running")
	}
	var (
		podUID string
		image  string
	)
	if req.GetImage() != "" {
		named, err := reference.ParseDockerRef(req.GetImage())
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "image %q: %v", req.GetImage(), err)
		}
		image = named.String()
	}
	if req.GetPodSandboxId() != "" || req.GetContainerId() != "" {
		c, err := s.cri()
		if err != nil {
			return nil, err
		}
		podID := req.GetPodSandboxId()
		if id := req.GetContainerId(); id != "" {
			cpod, cimage, err := containerPodAndImage(criContext(ctx), c, id)
			if err != nil {
				return nil, err
			}
			if podID != "" && podID != cpod {
				return nil, status.Errorf(codes.InvalidArgument, "container %q is not in pod %q", id, podID)
			}
			podID = cpod
			if image == "" {
				image = cimage
			}
		}
		st, err := c.PodSandboxStatus(criContext(ctx), &runtime.PodSandboxStatusRequest{PodSandboxId: podID})
		if err != nil {
			if status.Code(errgrpc.ToGRPC(err)) == codes.NotFound {
				return nil, status.Errorf(codes.NotFound, "pod sandbox %q not found", podID)
			}
			return nil, errgrpc.ToGRPC(err)
		}
		podUID = st.GetStatus().GetMetadata().GetUid()
	}
	url, err := s.rt.Progress.Issue(func(p hub.Pull) bool {
		return (podUID == "" || slices.Contains(p.Pods, podUID)) && (image == "" || p.Image == image)
	})
	if err != nil {
		return nil, status.Errorf(codes.Internal, "issue progress URL: %v", err)
	}
	return &api.ImagePullProgressResponse{Url: url}, nil
}

// containerPodAndImage finds a container's pod and the image it was
// created from, as a normalized reference when it was given by name.
func containerPodAndImage(ctx context.Context, c CRI, id string) (string, string, error) {
	list, err := c.ListContainers(ctx, &runtime.ListContainersRequest{Filter: &runtime.ContainerFilter{Id: id}})
	if err != nil {
		return "", "", errgrpc.ToGRPC(err)
	}
	if len(list.GetContainers()) == 0 {
		return "", "", status.Errorf(codes.NotFound, "container %q not found", id)
	}
	ctr := list.GetContainers()[0]
	img := ctr.GetImage().GetUserSpecifiedImage()
	if img == "" {
		img = ctr.GetImage().GetImage()
	}
	if named, err := reference.ParseDockerRef(img); err == nil {
		return ctr.GetPodSandboxId(), named.String(), nil
	}
	// An image ID: any pull of the pod will do.
	return ctr.GetPodSandboxId(), "", nil
}
