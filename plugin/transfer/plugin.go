// Package transfer registers the node's TransferPlugin "local" in place of
// upstream's plugins/transfer. It builds containerd's local transfer service
// from the same config keys and wraps it in Pullwise's transfer.Service, so
// CRI, the transfer gRPC service (ctr) and the Pullwise API all pull through
// Pullwise.
package transfer

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/transfer/local"
	"github.com/containerd/containerd/v2/pkg/imageverifier"
	"github.com/containerd/containerd/v2/plugins"

	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/lane"

	// Type registrations for transfer sources and destinations; without
	// them ctr's pull, import and export requests cannot be decoded.
	_ "github.com/containerd/containerd/v2/core/transfer/archive"
	_ "github.com/containerd/containerd/v2/core/transfer/image"
	_ "github.com/containerd/containerd/v2/core/transfer/registry"
)

func init() {
	registry.Register(&plugin.Registration{
		Type: plugins.TransferPlugin,
		ID:   "local",
		Requires: []plugin.Type{
			plugins.LeasePlugin,
			plugins.MetadataPlugin,
			plugins.DiffPlugin,
			plugins.ImageVerifierPlugin,
			plugins.SnapshotPlugin,
		},
		Config: defaultConfig(),
		InitFn: func(ic *plugin.InitContext) (any, error) {
			c := ic.Config.(*config)
			m, err := ic.GetSingle(plugins.MetadataPlugin)
			if err != nil {
				return nil, err
			}
			db := m.(*metadata.DB)
			l, err := ic.GetSingle(plugins.LeasePlugin)
			if err != nil {
				return nil, err
			}
			verifiers, err := imageVerifiers(ic)
			if err != nil {
				return nil, err
			}
			ups, err := unpackPlatforms(ic, db, c)
			if err != nil {
				return nil, err
			}
			// Layers are applied through Pullwise's lane, oldest pull first.
			// containerd's unpack limiter is on only to unpack the layers
			// of an image in parallel (parallelUnpack); it never binds.
			unpacks := lane.New(unpackLimit(c.MaxConcurrentUnpacks))
			for i := range ups {
				ups[i].Applier = lane.Applier{Applier: ups[i].Applier, Lane: unpacks}
			}
			next := local.NewTransferService(db.ContentStore(), metadata.NewImageStore(db), local.TransferConfig{
				Leases:                      l.(leases.Manager),
				MaxConcurrentDownloads:      c.MaxConcurrentDownloads,
				ConcurrentLayerFetchBuffer:  c.ConcurrentLayerFetchBuffer,
				MaxConcurrentUploadedLayers: c.MaxConcurrentUploadedLayers,
				MaxConcurrentUnpacks:        parallelUnpack,
				DuplicationSuppressor:       transfer.NewKeyedLock(),
				UnpackPlatforms:             ups,
				Verifiers:                   verifiers,
				RegistryConfigPath:          c.RegistryConfigPath,
			})
			ts, err := transfer.New(next, transfer.Local{
				Images:      metadata.NewImageStore(db),
				Content:     db.ContentStore(),
				Snapshotter: db.Snapshotter,
			}, prometheus.DefaultRegisterer)
			if err != nil {
				return nil, err
			}
			tc := transfer.Config{Downloads: lane.New(c.MaxConcurrentDownloads)}
			if c.RegistryConfigPath != "" {
				tc.HostDirs = []string{c.RegistryConfigPath}
			}
			ts.Configure(tc)
			return ts, nil
		},
	})
}

// parallelUnpack turns on containerd's parallel unpack, which applies the
// layers of one image at once and rebases them in order after, on a
// snapshotter that can rebase (overlayfs). containerd takes a place in its
// own unpack limiter for a layer as soon as the layer's download starts;
// this limit is too high to ever bind, so places are only taken from the
// lane, when a layer is in and ready to apply. With one layer at a time
// per image the oldest pull cannot use more than one CPU, and its
// remaining layers wait while younger pulls take the other places.
const parallelUnpack = math.MaxInt32

// unpackLimit is how many layers the node applies at once. Upstream reads
// max_concurrent_unpacks of 1 (its default) or less as no limit; Pullwise
// keeps the value when it is above 1 and otherwise uses one per CPU, which
// keeps the CPUs busy while letting images finish one after another.
func unpackLimit(configured int) int {
	if configured > 1 {
		return configured
	}
	return runtime.NumCPU()
}

func imageVerifiers(ic *plugin.InitContext) (map[string]imageverifier.ImageVerifier, error) {
	vps, err := ic.GetByType(plugins.ImageVerifierPlugin)
	if errors.Is(err, plugin.ErrPluginNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image verifiers: %w", err)
	}
	out := make(map[string]imageverifier.ImageVerifier, len(vps))
	for name, vp := range vps {
		out[name] = vp.(imageverifier.ImageVerifier)
	}
	return out, nil
}
