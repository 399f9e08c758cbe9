package service

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/cri/validate"
)

// RuntimeImagePullProgress is KEP-5334's method on CRI's own service, where
// a kubelet or crictl built from the KEP's API calls it.
const RuntimeImagePullProgress = "/runtime.v1.RuntimeService/ImagePullProgress"

// ExtraMethods serves KEP-5334's RPC under runtime.v1.RuntimeService as well
// as on the Pullwise service: the server plugin routes it here because the
// upstream CRI plugin, which owns that service, does not know the method.
func (s *Service) ExtraMethods() map[string]grpc.StreamHandler {
	return map[string]grpc.StreamHandler{RuntimeImagePullProgress: s.runtimeImagePullProgress}
}

func (s *Service) runtimeImagePullProgress(_ any, stream grpc.ServerStream) error {
	var req api.RuntimeImagePullProgressRequest
	// A request that does not decode has already been answered by grpc-go
	// with Internal, as gRPC's status code table asks for "error parsing
	// request proto", like every registered method.
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	// The KEP names a pod or a container; the Pullwise request's image
	// selector has no place here.
	if req.GetPodSandboxId() == "" && req.GetContainerId() == "" {
		return status.Error(codes.InvalidArgument, "one of pod_sandbox_id or container_id is required")
	}
	preq := &api.ImagePullProgressRequest{PodSandboxId: req.GetPodSandboxId(), ContainerId: req.GetContainerId()}
	// Stream handlers are past the unary validation the Pullwise method
	// gets: apply it here.
	if err := validate.Request(RuntimeImagePullProgress, preq); err != nil {
		return err
	}
	resp, err := s.ImagePullProgress(stream.Context(), preq)
	if err != nil {
		return err
	}
	return stream.SendMsg(resp)
}
