package server

import (
	"context"

	"google.golang.org/grpc"

	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// The namespace arrives in incoming metadata; services and the clients they
// call in-process read it from outgoing metadata too, so copy it across.

func unaryNamespace(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if ns, ok := namespaces.Namespace(ctx); ok {
		ctx = namespaces.WithNamespace(ctx, ns)
	}
	return handler(ctx, req)
}

func streamNamespace(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if ns, ok := namespaces.Namespace(ss.Context()); ok {
		ss = &streamWithContext{ServerStream: ss, ctx: namespaces.WithNamespace(ss.Context(), ns)}
	}
	return handler(srv, ss)
}

type streamWithContext struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *streamWithContext) Context() context.Context { return s.ctx }
