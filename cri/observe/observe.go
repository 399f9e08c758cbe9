// Package observe counts the CRI requests that pass through the Pullwise
// interceptor chain. Every Pullwise CRI feature hooks into that chain, so
// the count per method and code shows operators, and tests, that the chain
// sees every CRI RPC, unary and streaming alike.
package observe

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// criPrefix selects CRI's runtime.v1 services (RuntimeService, ImageService).
const criPrefix = "/runtime.v1."

// Interceptor counts CRI requests by full method and gRPC code.
type Interceptor struct {
	requests *prometheus.CounterVec
	streams  *prometheus.GaugeVec
}

// New registers the request counter on reg.
func New(reg prometheus.Registerer) (*Interceptor, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "pullwise",
		Name:      "cri_requests_total",
		Help:      "CRI requests seen by the Pullwise interceptor chain, by method and gRPC code.",
	}, []string{"method", "code"})
	streams := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "pullwise",
		Name:      "cri_streams_open",
		Help:      "CRI streaming requests open in the Pullwise interceptor chain, by method.",
	}, []string{"method"})
	for _, c := range []prometheus.Collector{requests, streams} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register CRI request metrics: %w", err)
		}
	}
	return &Interceptor{requests: requests, streams: streams}, nil
}

// UnaryServerInterceptor implements interceptor.Unary.
func (i *Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		i.count(info.FullMethod, err)
		return resp, err
	}
}

// StreamServerInterceptor implements interceptor.Stream. A stream is open
// while its handler runs (long-lived ones such as GetContainerEvents only
// notice a client leaving when they next send), and counted when it ends,
// with the code it ended with.
func (i *Interceptor) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if !strings.HasPrefix(info.FullMethod, criPrefix) {
			return handler(srv, ss)
		}
		open := i.streams.WithLabelValues(info.FullMethod)
		open.Inc()
		defer open.Dec()
		err := handler(srv, ss)
		i.count(info.FullMethod, err)
		return err
	}
}

func (i *Interceptor) count(method string, err error) {
	if !strings.HasPrefix(method, criPrefix) {
		return
	}
	i.requests.WithLabelValues(method, status.Code(err).String()).Inc()
}
