package service

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/cri/policy"
	"github.com/pullwise/pullwise/cri/validate"
	"github.com/pullwise/pullwise/transfer/pullctx"
)

var policies = map[api.PullPolicy]policy.Policy{
	api.PullPolicy_PULL_POLICY_UNSPECIFIED: policy.Always,
	api.PullPolicy_ALWAYS:                  policy.Always,
	api.PullPolicy_IF_NOT_PRESENT:          policy.IfNotPresent,
	api.PullPolicy_IF_NEWER_NOT_PRESENT:    policy.IfNewerNotPresent,
	api.PullPolicy_NEVER:                   policy.Never,
}

// PullImage implements api.PullwiseServer: CRI PullImage with a pull
// policy and a report of what was decided.
func (s *Service) PullImage(ctx context.Context, req *api.PullImageRequest) (*api.PullImageResponse, error) {
	criReq := &runtime.PullImageRequest{Image: req.GetImage(), Auth: req.GetAuth(), SandboxConfig: req.GetSandboxConfig()}
	if err := validate.PullImage(criReq); err != nil {
		return nil, err
	}
	p, ok := policies[req.GetPullPolicy()]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "unknown pull policy %v", req.GetPullPolicy())
	}
	c, err := s.cri()
	if err != nil {
		return nil, err
	}
	d := s.rt.Decider.With(func(ctx context.Context, r *runtime.PullImageRequest) (string, error) {
		// CRI is called in process, past the interceptors a CRI client's
		// pull goes through: do what they would.
		ctx = pullctx.WithPod(criContext(ctx), r.GetSandboxConfig().GetMetadata())
		ctx = s.rt.Sources.WithNames(ctx, r.GetImage().GetImage())
		pull := c.PullImage
		if s.rt.CRIPull != nil {
			if p := s.rt.CRIPull(); p != nil {
				pull = p
			}
		}
		resp, err := pull(ctx, r)
		if err != nil {
			return "", err
		}
		s.rt.Sources.LabelNames(ctx, r.GetImage().GetImage(), resp.GetImageRef())
		return resp.GetImageRef(), nil
	})
	dec, err := d.Pull(ctx, criReq, p)
	if err != nil {
		return nil, policy.ToStatus(fmt.Errorf("pull %s: %w", req.GetImage().GetImage(), err))
	}
	out := &api.PullImageResponse{
		ImageRef:     dec.ImageRef,
		Pulled:       dec.Pulled,
		Reason:       dec.Reason,
		LocalDigest:  dec.LocalDigest,
		RemoteDigest: dec.RemoteDigest,
		PullSource:   dec.PullSource,
		Warnings:     dec.Warnings,
	}
	if out.PullSource == "" {
		st, err := c.ImageStatus(criContext(ctx), &runtime.ImageStatusRequest{Image: req.GetImage()})
		if err == nil && st.GetImage() != nil {
			out.PullSource, _ = s.rt.Sources.Of(ctx, st.GetImage())
		}
	}
	return out, nil
}
