// Package pullwise registers the Pullwise gRPC service (GRPCPlugin
// "pullwise", config section [plugins."io.containerd.grpc.v1.pullwise"]) and
// the interceptors Pullwise adds to containerd's gRPC servers.
package pullwise

import (
	"fmt"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins"
	ctrdversion "github.com/containerd/containerd/v2/version"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/cri/observe"
	"github.com/pullwise/pullwise/cri/podctx"
	"github.com/pullwise/pullwise/cri/policy"
	"github.com/pullwise/pullwise/cri/pullsource"
	"github.com/pullwise/pullwise/cri/service"
	"github.com/pullwise/pullwise/plugin/interceptor"
	"github.com/pullwise/pullwise/plugin/version"
	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/gate"
)

func init() {
	registry.Register(&plugin.Registration{
		Type:   plugins.GRPCPlugin,
		ID:     "pullwise",
		Config: DefaultConfig(),
		// CRI's images plugin must have settled its pull path before it is
		// read here.
		Requires: []plugin.Type{plugins.CRIServicePlugin, plugins.MetadataPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			c := ic.Config.(*Config)
			if err := c.Validate(); err != nil {
				return nil, err
			}
			pullPath := func() (bool, string) { return criPullPath(ic.Plugins()) }
			if ok, warning := pullPath(); !ok {
				log.G(ic.Context).Warn("!!! " + warning)
			}
			t, err := ic.GetSingle(plugins.TransferPlugin)
			if err != nil {
				return nil, err
			}
			ts, ok := t.(*transfer.Service)
			if !ok {
				return nil, fmt.Errorf("transfer plugin is %T, not Pullwise's: is upstream's plugins/transfer built in?", t)
			}
			cri := criImages(ic)
			tc := ts.Config()
			tc.Gate = gate.New(c.MaxParallelImagePulls, time.Duration(c.PullQueueTimeout))
			tc.Bypass = cri.pinned
			if cri.registryConfigPath != "" {
				tc.HostDirs = append(tc.HostDirs, cri.registryConfigPath)
			}
			ts.Configure(tc)
			pinned := cri.pinned
			log.G(ic.Context).WithFields(log.Fields{
				"max_parallel_image_pulls": c.MaxParallelImagePulls,
				"pull_queue_timeout":       c.PullQueueTimeout,
				"queue_bypass":             pinned,
			}).Info("pull gate configured")
			m, err := ic.GetSingle(plugins.MetadataPlugin)
			if err != nil {
				return nil, err
			}
			store := metadata.NewImageStore(m.(*metadata.DB))
			sources := pullsource.New(store)
			return service.New(service.Runtime{
				PullwiseVersion: version.Version,
				Name:            ctrdversion.Name,
				Version:         ctrdversion.Version,
				PullPath:        pullPath,
				Pulls:           ts.Pulls,
				CRI:             func() (service.CRI, error) { return upstreamCRI(ic.Plugins()) },
				Sources:         sources,
				Decider:         newDecider(ic.Plugins(), ts, store, sources),
			}), nil
		},
	})

	registry.Register(&plugin.Registration{
		Type: interceptor.Plugin,
		ID:   "pull-pod",
		InitFn: func(*plugin.InitContext) (any, error) {
			return podctx.Interceptor{}, nil
		},
	})

	registry.Register(&plugin.Registration{
		Type:     interceptor.Plugin,
		ID:       "pull-source",
		Requires: []plugin.Type{plugins.MetadataPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			m, err := ic.GetSingle(plugins.MetadataPlugin)
			if err != nil {
				return nil, err
			}
			return pullsource.New(metadata.NewImageStore(m.(*metadata.DB))), nil
		},
	})

	registry.Register(&plugin.Registration{
		Type: interceptor.Plugin,
		ID:   "pull-policy",
		// The pullwise plugin's config is read here.
		Requires: []plugin.Type{plugins.GRPCPlugin, plugins.MetadataPlugin, plugins.TransferPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			c := DefaultConfig()
			if p := ic.Plugins().Get(plugins.GRPCPlugin, "pullwise"); p != nil {
				c = p.Config.(*Config)
			}
			m, err := ic.GetSingle(plugins.MetadataPlugin)
			if err != nil {
				return nil, err
			}
			t, err := ic.GetSingle(plugins.TransferPlugin)
			if err != nil {
				return nil, err
			}
			ts, ok := t.(*transfer.Service)
			if !ok {
				return nil, fmt.Errorf("transfer plugin is %T, not Pullwise's", t)
			}
			store := metadata.NewImageStore(m.(*metadata.DB))
			nodeWide := c.AlwaysPullPolicy == PolicyIfNewerNotPresent
			log.G(ic.Context).WithField("always_pull_policy", c.AlwaysPullPolicy).Info("CRI pull policy")
			return policy.NewInterceptor(newDecider(ic.Plugins(), ts, store, pullsource.New(store)), nodeWide), nil
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
	c, err := criconfig.Read(p.Config)
	if err != nil {
		return false, "cannot tell whether CRI pulls use the transfer service: " + err.Error()
	}
	ok, err := c.UsesTransfer()
	if err != nil {
		return false, "cannot tell whether CRI pulls use the transfer service: " + err.Error()
	}
	if !ok {
		return false, service.BypassWarning
	}
	return true, ""
}

type criImagesInfo struct {
	// pinned are the images CRI pins (the sandbox image among them), whose
	// pulls skip the queue: no pod starts without them.
	pinned []string
	// registryConfigPath is CRI's hosts.toml root(s), for pulls (from ctr)
	// that name none.
	registryConfigPath string
}

func criImages(ic *plugin.InitContext) criImagesInfo {
	var info criImagesInfo
	p := ic.Plugins().Get(plugins.CRIServicePlugin, "images")
	if p == nil {
		return info
	}
	info.registryConfigPath = p.Meta.Exports["RegistryConfigPath"]
	c, err := criconfig.Read(p.Config)
	if err != nil {
		log.G(ic.Context).WithError(err).Warn("cannot read CRI pinned_images: the sandbox image will queue like any pull")
		return info
	}
	for _, r := range c.PinnedImages {
		info.pinned = append(info.pinned, r)
	}
	return info
}

// upstreamCRI returns the CRI plugin's instance. It is a GRPCPlugin like
// this one, so it cannot be required, only looked up once it exists.
func upstreamCRI(set *plugin.Set) (service.CRI, error) {
	p := set.Get(plugins.GRPCPlugin, "cri")
	if p == nil {
		return nil, fmt.Errorf("CRI plugin not loaded")
	}
	inst, err := p.Instance()
	if err != nil {
		return nil, fmt.Errorf("CRI plugin failed to start: %w", err)
	}
	c, ok := inst.(service.CRI)
	if !ok {
		return nil, fmt.Errorf("CRI plugin instance %T does not serve CRI", inst)
	}
	return c, nil
}

// newDecider builds the pull-policy decider: CRI says what is present, the
// node's hosts.toml and the pull's credentials reach the registry.
func newDecider(set *plugin.Set, ts *transfer.Service, store images.Store, sources *pullsource.Sources) *policy.Decider {
	return policy.New(policy.Deps{
		Local: policy.CRILocal(func() (policy.ImageStatuser, error) { return upstreamCRI(set) }, store),
		Resolve: policy.RegistryResolver(func() []string {
			return ts.Config().HostDirs
		}),
		Reassert: sources.Record,
	}, policy.DefaultRetry)
}
