package server

import (
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"

	"github.com/containerd/containerd/v2/plugins"
)

type metricsConfig struct {
	GRPCHistogram bool `toml:"grpc_histogram"`
}

func init() {
	registry.Register(&plugin.Registration{
		Type:     plugins.MetricsPlugin,
		ID:       "grpc-prometheus",
		Requires: []plugin.Type{plugins.GRPCPlugin},
		Config:   &metricsConfig{},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			var opts []grpcprom.ServerMetricsOption
			if ic.Config.(*metricsConfig).GRPCHistogram {
				opts = append(opts, grpcprom.WithServerHandlingTimeHistogram())
			}
			m := grpcprom.NewServerMetrics(opts...)
			// containerd's metrics endpoint serves the default registry.
			prometheus.MustRegister(m)
			return m, nil
		},
	})
	registry.Register(&plugin.Registration{
		Type:     plugins.MetricsPlugin,
		ID:       "grpc-otel",
		Requires: []plugin.Type{plugins.GRPCPlugin},
		InitFn: func(*plugin.InitContext) (any, error) {
			return otelgrpc.NewServerHandler(), nil
		},
	})
}
