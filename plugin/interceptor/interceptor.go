// Package interceptor defines the plugin type through which Pullwise plugins
// add gRPC interceptors to containerd's own servers, so CRI behaviour can be
// extended without forking the upstream CRI plugin.
package interceptor

import (
	"github.com/containerd/plugin"
	"google.golang.org/grpc"
)

// Plugin is the type of plugins that contribute interceptors. Their instances
// implement Unary, Stream, or both.
const Plugin plugin.Type = "io.containerd.pullwise.interceptor.v1"

// Unary is implemented by interceptor plugins that wrap unary RPCs.
type Unary interface {
	UnaryServerInterceptor() grpc.UnaryServerInterceptor
}

// Stream is implemented by interceptor plugins that wrap streaming RPCs.
type Stream interface {
	StreamServerInterceptor() grpc.StreamServerInterceptor
}

// Collect returns the interceptors of every initialized plugin of type
// Plugin, in plugin initialization order (which follows registration order
// within the type). A plugin that failed to initialize has already been
// logged by containerd and is left out rather than failing the server.
func Collect(set *plugin.Set) ([]grpc.UnaryServerInterceptor, []grpc.StreamServerInterceptor) {
	var (
		unary  []grpc.UnaryServerInterceptor
		stream []grpc.StreamServerInterceptor
	)
	for _, p := range set.GetAll() {
		if p.Registration.Type != Plugin {
			continue
		}
		inst, err := p.Instance()
		if err != nil {
			continue
		}
		if u, ok := inst.(Unary); ok {
			unary = append(unary, u.UnaryServerInterceptor())
		}
		if s, ok := inst.(Stream); ok {
			stream = append(stream, s.StreamServerInterceptor())
		}
	}
	return unary, stream
}
