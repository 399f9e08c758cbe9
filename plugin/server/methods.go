package server

import (
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// extraMethods is implemented by GRPCPlugin instances that serve methods of
// a service another plugin owns. KEP-5334 adds ImagePullProgress to
// runtime.v1.RuntimeService, which the upstream CRI plugin registers from a
// cri-api that predates it; grpc-go takes one registration per service, so
// the method is served as an unknown method of that service instead.
type extraMethods interface {
	// ExtraMethods maps full method names ("/pkg.Service/Method") to
	// handlers.
	ExtraMethods() map[string]grpc.StreamHandler
}

// methods routes the calls grpc-go finds no registered method for. It is
// filled while services are registered, before the server serves, and only
// read after.
type methods struct {
	server   *grpc.Server
	handlers map[string]grpc.StreamHandler
}

func (m *methods) add(instance any) error {
	e, ok := instance.(extraMethods)
	if !ok {
		return nil
	}
	for name, h := range e.ExtraMethods() {
		if _, dup := m.handlers[name]; dup {
			return fmt.Errorf("method %s is served twice", name)
		}
		if m.registered(name) {
			// The owning service serves it itself, and grpc-go would never
			// route the call here.
			return fmt.Errorf("method %s is already registered by its service", name)
		}
		m.handlers[name] = h
	}
	return nil
}

func (m *methods) registered(fullMethod string) bool {
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		return false
	}
	for _, md := range m.server.GetServiceInfo()[svc].Methods {
		if md.Name == method {
			return true
		}
	}
	return false
}

// handle is the server's UnknownServiceHandler. What it does not know
// fails as grpc-go fails unknown calls, with Unimplemented.
func (m *methods) handle(srv any, stream grpc.ServerStream) error {
	name, _ := grpc.MethodFromServerStream(stream)
	if h, ok := m.handlers[name]; ok {
		return h(srv, stream)
	}
	svc, _, _ := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	if _, known := m.server.GetServiceInfo()[svc]; known {
		return status.Errorf(codes.Unimplemented, "unknown method %s", name)
	}
	return status.Errorf(codes.Unimplemented, "unknown service %s", svc)
}
