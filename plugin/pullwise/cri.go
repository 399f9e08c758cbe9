package pullwise

import (
	"fmt"
	"path/filepath"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/log"
	"github.com/containerd/plugin"

	"github.com/pullwise/pullwise/cri/criconfig"
	"github.com/pullwise/pullwise/cri/cripull"
	"github.com/pullwise/pullwise/cri/policy"
	"github.com/pullwise/pullwise/cri/pullsource"
	"github.com/pullwise/pullwise/cri/service"
	"github.com/pullwise/pullwise/plugin/interceptor"
	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/lane"
)

// criPullPath reports whether CRI pulls reach Pullwise's transfer service:
// through CRI's own transfer path, or through the cri-pull interceptor
// where CRI would pull locally.
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
	if ok || criPuller(set) != nil {
		return true, ""
	}
	return false, service.BypassWarning(c.LocalPullOptions())
}

// criPuller returns the Puller that serves CRI pulls in CRI's place, or
// nil where CRI pulls through the transfer service itself (or cri-pull is
// not loaded).
func criPuller(set *plugin.Set) *cripull.Puller {
	p := set.Get(interceptor.Plugin, criPullID)
	if p == nil {
		return nil
	}
	inst, err := p.Instance()
	if err != nil {
		return nil
	}
	i, _ := inst.(cripull.Interceptor)
	return i.Puller
}

// newCRIPuller returns a Puller when CRI would take its local pull path,
// else nil. Deprecated registry.mirrors are written as hosts.toml under
// stateDir, so they resolve like config_path.
func newCRIPuller(ic *plugin.InitContext, ts *transfer.Service, db *metadata.DB) (*cripull.Puller, error) {
	p := ic.Plugins().Get(plugins.CRIServicePlugin, "images")
	if p == nil {
		return nil, nil
	}
	if _, err := p.Instance(); err != nil {
		return nil, nil
	}
	c, err := criconfig.Read(p.Config)
	if err != nil {
		return nil, err
	}
	if ok, err := c.UsesTransfer(); err != nil || ok {
		return nil, err
	}
	if err := cripull.CheckSnapshotters(c, ts.Config().Unpacks); err != nil {
		return nil, err
	}
	hostDir := c.Registry.ConfigPath
	if hostDir == "" && len(c.Registry.Mirrors) > 0 {
		hostDir = filepath.Join(ic.Properties[plugins.PropertyStateDir], "registry-mirrors")
		if err := cripull.WriteMirrorHosts(hostDir, c.Registry.Mirrors); err != nil {
			return nil, fmt.Errorf("write CRI's registry.mirrors as hosts.toml: %w", err)
		}
	}
	if c.MaxConcurrentDownloads != criconfig.DefaultMaxConcurrentDownloads && c.MaxConcurrentDownloads > 0 {
		// Stock applies CRI's limit to CRI's local pulls; Pullwise has
		// one node-wide lane, which takes it.
		tc := ts.Config()
		tc.Downloads = lane.New(c.MaxConcurrentDownloads)
		ts.Configure(tc)
		log.G(ic.Context).WithField("max_concurrent_downloads", c.MaxConcurrentDownloads).
			Info("CRI's max_concurrent_downloads limits downloads node-wide")
	}
	return cripull.New(cripull.Deps{
		Transfer: ts,
		Images:   metadata.NewImageStore(db),
		Content:  db.ContentStore(),
		CRI: func() (cripull.CRIImages, error) {
			inst, err := p.Instance()
			if err != nil {
				return nil, err
			}
			ci, ok := inst.(cripull.CRIImages)
			if !ok {
				return nil, fmt.Errorf("CRI images plugin instance %T has no UpdateImage", inst)
			}
			return ci, nil
		},
		Config:  c,
		HostDir: hostDir,
	})
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
		Resolve: policy.RegistryResolver(func() ([]string, *health.Table) {
			c := ts.Config()
			return c.HostDirs, c.Health
		}),
		Reassert: sources.Record,
	}, policy.DefaultRetry)
}
