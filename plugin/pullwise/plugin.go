// Package pullwise registers the Pullwise gRPC service (GRPCPlugin
// "pullwise", config section [plugins."io.containerd.grpc.v1.pullwise"]) and
// the interceptors Pullwise adds to containerd's gRPC servers.
package pullwise

import (
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/containerd/containerd/v2/plugins"
	ctrdversion "github.com/containerd/containerd/v2/version"

	"github.com/pullwise/pullwise/cri/observe"
	"github.com/pullwise/pullwise/cri/service"
	"github.com/pullwise/pullwise/plugin/interceptor"
	"github.com/pullwise/pullwise/plugin/version"
)

func init() {
	registry.Register(&plugin.Registration{
		Type:   plugins.GRPCPlugin,
		ID:     "pullwise",
		Config: DefaultConfig(),
		// Only for ordering: CRI's images plugin must have settled its pull
		// path before it is read here.
		Requires: []plugin.Type{plugins.CRIServicePlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			if err := ic.Config.(*Config).Validate(); err != nil {
				return nil, err
			}
			pullPath := func() (bool, string) { return criPullPath(ic.Plugins()) }
			if ok, warning := pullPath(); !ok {
				log.G(ic.Context).Warn("!!! " + warning)
			}
			return service.New(service.Runtime{
				PullwiseVersion: version.Version,
				Name:            ctrdversion.Name,
				Version:         ctrdversion.Version,
				PullPath:        pullPath,
			}), nil
		},
	})

	registry.Register(&plugin.Registration{
		Type: interceptor.Plugin,
		ID:   "cri-requests",
		InitFn: func(*plugin.InitContext) (any, error) {
			return observe.New(prometheus.DefaultRegisterer)
		},
	})
}

// criPullPath reports whether CRI pulls reach the transfer service.
func criPullPath(set *plugin.Set) (bool, string) {
	p := set.Get(plugins.CRIServicePlugin, "images")
	if p == nil {
		return false, "CRI images plugin is not loaded: CRI pulls do not exist on this node"
	}
	if _, err := p.Instance(); err != nil {
		return false, "CRI images plugin failed to start: " + err.Error()
	}
	ok, err := service.CRIUsesTransfer(p.Config)
	if err != nil {
		return false, "cannot tell whether CRI pulls use the transfer service: " + err.Error()
	}
	if !ok {
		return false, service.BypassWarning
	}
	return true, ""
}
