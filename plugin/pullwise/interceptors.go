package pullwise

import (
	"fmt"

	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/cri/cripull"
	"github.com/pullwise/pullwise/cri/observe"
	"github.com/pullwise/pullwise/cri/podctx"
	"github.com/pullwise/pullwise/cri/policy"
	"github.com/pullwise/pullwise/cri/pullsource"
	"github.com/pullwise/pullwise/cri/service"
	"github.com/pullwise/pullwise/cri/validate"
	"github.com/pullwise/pullwise/plugin/interceptor"
	"github.com/pullwise/pullwise/transfer"
)

// The chain runs interceptors in plugin initialization order, outermost
// first: registration order, except that a plugin waits for the types it
// requires. pull-pod, pull-source and cri-requests need no gRPC plugin and
// so wrap pull-policy and pinning: the pod reaches every pull, and the
// pull source is copied whatever pull-policy decides.
func init() {
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
			db := m.(*metadata.DB)
			return pullsource.New(metadata.NewImageStore(db), db.ContentStore()), nil
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
			db, ts, err := metadataAndTransfer(ic)
			if err != nil {
				return nil, err
			}
			store := metadata.NewImageStore(db)
			nodeWide := c.AlwaysPullPolicy == PolicyIfNewerNotPresent
			log.G(ic.Context).WithField("always_pull_policy", c.AlwaysPullPolicy).Info("CRI pull policy")
			return policy.NewInterceptor(newDecider(ic.Plugins(), ts, store, pullsource.New(store, db.ContentStore())), nodeWide), nil
		},
	})

	registry.Register(&plugin.Registration{
		Type: interceptor.Plugin,
		ID:   "cri-requests",
		InitFn: func(*plugin.InitContext) (any, error) {
			return observe.New(prometheus.DefaultRegisterer)
		},
	})

	// Inside cri-requests, so refusals are counted, and ahead of
	// pull-policy and pinning, so they never see a request that cannot be
	// served.
	registry.Register(&plugin.Registration{
		Type: interceptor.Plugin,
		ID:   "cri-validate",
		InitFn: func(*plugin.InitContext) (any, error) {
			return validate.Interceptor{}, nil
		},
	})

	// Last, so it is the innermost PullImage interceptor: where CRI would
	// take its local pull path, this is CRI's pull, and every interceptor
	// above wraps it as it wraps CRI's.
	registry.Register(&plugin.Registration{
		Type:     interceptor.Plugin,
		ID:       criPullID,
		Requires: []plugin.Type{plugins.GRPCPlugin, plugins.CRIServicePlugin, plugins.MetadataPlugin, plugins.TransferPlugin},
		InitFn:   initCRIPull,
	})
}

// criPullID names the interceptor that serves CRI pulls CRI would pull
// locally.
const criPullID = "cri-pull"

func initCRIPull(ic *plugin.InitContext) (any, error) {
	db, ts, err := metadataAndTransfer(ic)
	if err != nil {
		return nil, err
	}
	p, err := newCRIPuller(ic, ts, db)
	if err != nil {
		// CRI keeps pulling on its own path, without Pullwise.
		log.G(ic.Context).WithError(err).Warn("!!! " + service.BypassWarning(nil))
		return nil, err
	}
	if p != nil {
		c, _ := criconfig.Read(ic.Plugins().Get(plugins.CRIServicePlugin, "images").Config)
		log.G(ic.Context).WithField("cri_local_pull_options", c.LocalPullOptions()).
			Info("CRI would pull on its local path; Pullwise serves CRI pulls through the transfer service, keeping those options")
	}
	return cripull.Interceptor{Puller: p}, nil
}

// metadataAndTransfer returns the metadata store and Pullwise's transfer
// service, which interceptors that pull or decide pulls work with.
func metadataAndTransfer(ic *plugin.InitContext) (*metadata.DB, *transfer.Service, error) {
	m, err := ic.GetSingle(plugins.MetadataPlugin)
	if err != nil {
		return nil, nil, err
	}
	t, err := ic.GetSingle(plugins.TransferPlugin)
	if err != nil {
		return nil, nil, err
	}
	ts, ok := t.(*transfer.Service)
	if !ok {
		return nil, nil, fmt.Errorf("transfer plugin is %T, not Pullwise's", t)
	}
	return m.(*metadata.DB), ts, nil
}
