package service

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/cri/pullsource"
)

// CRI is the upstream CRI service, called in process.
type CRI interface {
	runtime.RuntimeServiceServer
	runtime.ImageServiceServer
}

// cri returns the upstream CRI service. It is looked up per call: it
// initializes after this service.
func (s *Service) cri() (CRI, error) {
	if s.rt.CRI == nil {
		return nil, status.Error(codes.Unavailable, "CRI is not loaded in this runtime")
	}
	c, err := s.rt.CRI()
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "CRI is not available: %v", err)
	}
	return c, nil
}

// criContext is what CRI's own gRPC layer sets up before calling it.
func criContext(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, criconfig.Namespace)
}

// ImageStatus implements api.PullwiseServer.
func (s *Service) ImageStatus(ctx context.Context, req *api.ImageStatusRequest) (*api.ImageStatusResponse, error) {
	c, err := s.cri()
	if err != nil {
		return nil, err
	}
	ref := req.GetImage().GetImage()
	if ref == "" {
		return nil, status.Error(codes.InvalidArgument, "image is required")
	}
	resp, err := c.ImageStatus(criContext(ctx), &runtime.ImageStatusRequest{Image: req.GetImage(), Verbose: req.GetVerbose()})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	if resp.GetImage() == nil {
		return nil, status.Errorf(codes.NotFound, "image %q not found", ref)
	}
	src, blobs := s.rt.Sources.Of(ctx, resp.GetImage())
	out := &api.ImageStatusResponse{Image: resp.GetImage(), PullSource: src, Info: resp.GetInfo()}
	if req.GetVerbose() {
		if out.Info == nil {
			out.Info = map[string]string{}
		}
		out.Info[pullsource.InfoPullSource] = src
		if blobs != "" {
			out.Info[pullsource.InfoBlobSources] = blobs
		}
	}
	return out, nil
}

// ListImages implements api.PullwiseServer.
func (s *Service) ListImages(ctx context.Context, req *api.ListImagesRequest) (*api.ListImagesResponse, error) {
	c, err := s.cri()
	if err != nil {
		return nil, err
	}
	resp, err := c.ListImages(criContext(ctx), &runtime.ListImagesRequest{Filter: req.GetFilter()})
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	out := &api.ListImagesResponse{}
	for _, img := range resp.GetImages() {
		src, _ := s.rt.Sources.Of(ctx, img)
		out.Images = append(out.Images, &api.ImageWithSource{Image: img, PullSource: src})
	}
	return out, nil
}

// ContainerStatus implements api.PullwiseServer.
func (s *Service) ContainerStatus(ctx context.Context, req *api.ContainerStatusRequest) (*api.ContainerStatusResponse, error) {
	c, err := s.cri()
	if err != nil {
		return nil, err
	}
	id := req.GetContainerId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "container_id is required")
	}
	resp, err := c.ContainerStatus(criContext(ctx), &runtime.ContainerStatusRequest{ContainerId: id, Verbose: req.GetVerbose()})
	if err != nil {
		if st := errgrpc.ToGRPC(err); status.Code(st) == codes.NotFound {
			return nil, status.Errorf(codes.NotFound, "container %q not found", id)
		}
		return nil, errgrpc.ToGRPC(fmt.Errorf("container %q: %w", id, err))
	}
	src := resp.GetStatus().GetLabels()[pullsource.ContainerLabel]
	out := &api.ContainerStatusResponse{Status: resp.GetStatus(), ImagePullSource: src, Info: resp.GetInfo()}
	if req.GetVerbose() {
		if out.Info == nil {
			out.Info = map[string]string{}
		}
		out.Info[pullsource.InfoImagePullSource] = src
	}
	return out, nil
}
