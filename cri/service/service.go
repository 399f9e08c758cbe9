// Package service implements the Pullwise gRPC service, served on
// containerd's socket next to CRI's runtime.v1.
package service

import (
	"context"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/cri/policy"
	"github.com/pullwise/pullwise/cri/pullsource"
	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/health"
)

// Runtime describes the runtime the service is compiled into.
type Runtime struct {
	PullwiseVersion string
	// Commit is the commit the runtime was built from.
	Commit string
	// Upstream is the containerd release the runtime carries.
	Upstream string
	Name     string
	Version  string
	// PullPath reports whether CRI pulls reach the transfer service and,
	// when not, a warning for the operator. It is asked on every call since
	// CRI may load after this service.
	PullPath func() (usesTransfer bool, warning string)
	// Pulls lists the node's pulls in flight or waiting.
	Pulls func() []transfer.PullStatus
	// Registries lists the registry hosts the node remembers.
	Registries func() []health.Status
	// CRI returns the upstream CRI service, which loads after this one.
	CRI func() (CRI, error)
	// CRIPull is CRI's PullImage as the node serves it: Pullwise's
	// (cri/cripull) where CRI would take its local pull path, else nil
	// and CRI's own.
	CRIPull func() func(context.Context, *runtime.PullImageRequest) (*runtime.PullImageResponse, error)
	// Sources reads the pull sources of images.
	Sources *pullsource.Sources
	// Decider applies pull policies.
	Decider *policy.Decider
	// Progress issues progress stream URLs; nil when not serving them.
	Progress ProgressIssuer
	// Close releases what the runtime holds for the service, such as the
	// progress server.
	Close func() error
}

// Service is the Pullwise API. RPCs that later work implements answer
// Unimplemented through the embedded type.
type Service struct {
	api.UnimplementedPullwiseServer
	rt Runtime
}

// New returns the service for rt.
func New(rt Runtime) *Service {
	return &Service{rt: rt}
}

// Close stops what the service runs besides gRPC.
func (s *Service) Close() error {
	if s.rt.Close != nil {
		return s.rt.Close()
	}
	return nil
}

// Register adds the service to a gRPC server; containerd's server plugin
// calls it for every GRPCPlugin instance that has it.
func (s *Service) Register(gs *grpc.Server) error {
	api.RegisterPullwiseServer(gs, s)
	return nil
}

// Version implements api.PullwiseServer.
func (s *Service) Version(context.Context, *api.VersionRequest) (*api.VersionResponse, error) {
	resp := &api.VersionResponse{
		PullwiseVersion: s.rt.PullwiseVersion,
		Commit:          s.rt.Commit,
		UpstreamVersion: s.rt.Upstream,
		RuntimeName:     s.rt.Name,
		RuntimeVersion:  s.rt.Version,
	}
	usesTransfer, warning := s.rt.PullPath()
	resp.CriPullsUseTransfer = usesTransfer
	if warning != "" {
		resp.Warnings = append(resp.Warnings, warning)
	}
	return resp, nil
}

// ListPulls implements api.PullwiseServer.
func (s *Service) ListPulls(context.Context, *api.ListPullsRequest) (*api.ListPullsResponse, error) {
	resp := &api.ListPullsResponse{}
	for _, p := range s.rt.Pulls() {
		resp.Pulls = append(resp.Pulls, &api.Pull{
			Image:          p.Image,
			Pod:            p.Pod,
			State:          p.State,
			WaitedMs:       p.Waited.Milliseconds(),
			BytesDone:      p.BytesDone,
			BytesTotal:     p.BytesTotal,
			Callers:        int32(p.Callers),
			BytesFromPeers: p.BytesFromPeers,
		})
	}
	return resp, nil
}
