// Package pullwise registers the Pullwise gRPC service (GRPCPlugin
// "pullwise", config section [plugins."io.containerd.grpc.v1.pullwise"]) and
// the interceptors Pullwise adds to containerd's gRPC servers. The logic is
// in cri/ and transfer/; this package only wires it.
package pullwise

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/prometheus/client_golang/prometheus"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins"
	ctrdversion "github.com/containerd/containerd/v2/version"

	"github.com/pullwise/pullwise/cri/progress"
	"github.com/pullwise/pullwise/cri/pullsource"
	"github.com/pullwise/pullwise/cri/service"
	"github.com/pullwise/pullwise/plugin/version"
	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/gate"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/peers/keep"
)

func init() {
	registry.Register(&plugin.Registration{
		Type:   plugins.GRPCPlugin,
		ID:     "pullwise",
		Config: DefaultConfig(),
		// CRI's images plugin must have settled its pull path before it is
		// read here.
		Requires: []plugin.Type{plugins.CRIServicePlugin, plugins.MetadataPlugin, plugins.ContentPlugin},
		InitFn: func(ic *plugin.InitContext) (any, error) {
			c := ic.Config.(*Config)
			if err := c.Validate(); err != nil {
				return nil, err
			}
			// Whether CRI pulls reach Pullwise is said at start by the
			// cri-pull interceptor, which loads after this plugin.
			pullPath := func() (bool, string) { return criPullPath(ic.Plugins()) }
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
			m, err := ic.GetSingle(plugins.MetadataPlugin)
			if err != nil {
				return nil, err
			}
			if tc.Space, err = newLedger(ic, c, m.(*metadata.DB), tc.Ratio); err != nil {
				return nil, err
			}
			tc.Health = health.New(c.Health())
			if err := prometheus.Register(tc.Health); err != nil {
				return nil, fmt.Errorf("register registry health metrics: %w", err)
			}
			closePeers := func() error { return nil }
			if c.Peers.Enabled {
				// Peers that cannot start (a port taken, a key unreadable)
				// leave pulls to the registries, as with peers off: the
				// node still pulls, and says why it shares nothing.
				if tc.Peers, err = startPeers(ic, c.Peers, tc.Health); err != nil {
					log.G(ic.Context).WithError(err).Error("!!! peers not started: pulls go to the registries only")
				} else {
					closePeers = tc.Peers.Close
					if c.Peers.KeepBytes > 0 && c.Peers.KeepFor > 0 {
						tc.Keep = keep.New(metadata.NewLeaseManager(m.(*metadata.DB)), time.Duration(c.Peers.KeepFor), c.Peers.KeepBytes)
					}
				}
			}
			ts.Configure(tc)
			log.G(ic.Context).WithFields(log.Fields{
				"registry_cooldown":         c.RegistryCooldown,
				"registry_max_cooldown":     c.RegistryMaxCooldown,
				"registry_response_timeout": c.RegistryResponseTimeout,
				"registry_read_timeout":     c.RegistryReadTimeout,
				"registry_max_retry_wait":   c.RegistryMaxRetryWait,
			}).Info("registry health configured")
			pinned := cri.pinned
			log.G(ic.Context).WithFields(log.Fields{
				"max_parallel_image_pulls": c.MaxParallelImagePulls,
				"pull_queue_timeout":       c.PullQueueTimeout,
				"queue_bypass":             pinned,
			}).Info("pull gate configured")
			store := metadata.NewImageStore(m.(*metadata.DB))
			sources := pullsource.New(store, m.(*metadata.DB).ContentStore())
			srv, err := progress.Listen(ts.Hub(), progress.Options{
				Address:        c.ProgressAddress,
				Port:           c.ProgressPort,
				TokenTTL:       time.Duration(c.ProgressTokenTTL),
				MaxConnections: c.ProgressMaxConnections,
				ClientTimeout:  time.Duration(c.ProgressClientTimeout),
			})
			if err != nil {
				return nil, err
			}
			log.G(ic.Context).WithField("address", srv.Addr()).Info("serving image pull progress")
			return service.New(service.Runtime{
				PullwiseVersion: version.Pullwise(),
				Commit:          version.Commit(),
				Upstream:        version.Upstream(),
				Name:            ctrdversion.Name,
				Version:         ctrdversion.Version,
				PullPath:        pullPath,
				Pulls:           ts.Pulls,
				Registries:      tc.Health.Hosts,
				CRI:             func() (service.CRI, error) { return upstreamCRI(ic.Plugins()) },
				CRIPull: func() func(context.Context, *runtime.PullImageRequest) (*runtime.PullImageResponse, error) {
					if p := criPuller(ic.Plugins()); p != nil {
						return p.PullImage
					}
					return nil
				},
				Sources:  sources,
				Decider:  newDecider(ic.Plugins(), ts, store, sources),
				Progress: srv,
				Close:    func() error { return errors.Join(srv.Close(), closePeers()) },
			}), nil
		},
	})
}
