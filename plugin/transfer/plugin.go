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
	"os"
	"path/filepath"
	"runtime"
	"slices"

	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/transfer/local"
	"github.com/containerd/containerd/v2/core/unpack"
	"github.com/containerd/containerd/v2/pkg/imageverifier"
	"github.com/containerd/containerd/v2/plugins"

	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/aliases"
	"github.com/pullwise/pullwise/transfer/commits"
	"github.com/pullwise/pullwise/transfer/gunzip"
	"github.com/pullwise/pullwise/transfer/sourcelabel"

	// Type registrations for transfer sources and destinations; without
	// them ctr's pull, import and export requests cannot be decoded.
	_ "github.com/containerd/containerd/v2/core/transfer/archive"
	_ "github.com/containerd/containerd/v2/core/transfer/image"
	_ "github.com/containerd/containerd/v2/core/transfer/registry"
)

func init() {
	// Registered here rather than in InitFn: containerd registers the
	// stream_processors of its config after init and before plugins
	// start, so an operator's own processor for gzip layers still comes
	// first.
	diff.RegisterProcessor(gunzip.Handler)
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
			// The pulls' metadata writes, in due order (transfer/commits).
			turns := commits.New()
			u := newUnpacking(c, db, turns, ups, loadedSnapshotters(ic, db, c, ups))
			for _, col := range []prometheus.Collector{u.costs, turns} {
				if err := prometheus.Register(col); err != nil {
					return nil, err
				}
			}
			// Pulls' records get their source labels in the write that
			// stores them, not in one more (sourcelabel.Store), and the
			// records CRI makes after its pulls in that write too
			// (transfer/aliases).
			stored := aliases.Store{Store: metadata.NewImageStore(db), DB: db}
			imgs := sourcelabel.Store{Store: commits.Images{Store: stored, Turns: turns}}
			cs := commits.Content{Store: db.ContentStore(), Turns: turns}
			var base []images.Handler
			if u.early != nil {
				u.early.Content = cs
				u.early.Dir = filepath.Join(ic.Properties[plugins.PropertyRootDir], "early")
				if err := os.MkdirAll(u.early.Dir, 0o700); err != nil {
					return nil, err
				}
				base = append(base, images.HandlerFunc(u.early.Handler))
			}
			next := local.NewTransferService(cs, imgs, local.TransferConfig{
				BaseHandlers:                base,
				Leases:                      l.(leases.Manager),
				MaxConcurrentDownloads:      c.MaxConcurrentDownloads,
				ConcurrentLayerFetchBuffer:  c.ConcurrentLayerFetchBuffer,
				MaxConcurrentUploadedLayers: c.MaxConcurrentUploadedLayers,
				MaxConcurrentUnpacks:        containerdUnpacks(u.parallel),
				DuplicationSuppressor:       u.chains,
				UnpackPlatforms:             u.platforms,
				Verifiers:                   verifiers,
				RegistryConfigPath:          c.RegistryConfigPath,
			})
			ts, err := transfer.New(next, transfer.Local{
				Images:      imgs,
				Content:     cs,
				Snapshotter: db.Snapshotter,
			}, prometheus.DefaultRegisterer)
			if err != nil {
				return nil, err
			}
			ts.Configure(u.serviceConfig(c))
			// Last, so a plugin that failed to load leaves gzip layers to
			// containerd.
			gunzip.Enable(c.GzipReadAhead)
			u.log(ic.Context, c)
			return ts, nil
		},
	})
}

// parallelUnpack reports whether containerd unpacks the layers of an image
// in parallel: where max_concurrent_unpacks is above 1, as upstream, and a
// snapshotter unpacked into can rebase (overlayfs outside a user
// namespace, erofs). containerd then applies the layers of one image at
// once and rebases them in order after. It takes a place in its own
// limiter for a layer as soon as the layer's download starts, so it gets a
// limit too high to ever bind (containerdUnpacks), and places are taken
// from the lane only, when a layer is in and ready to apply.
//
// Upstream has it off by default (max_concurrent_unpacks = 1); Pullwise's
// default is one per CPU, so it is on wherever there is more than one CPU
// to unpack with. It gets the first images of a burst in sooner, and the
// last no later, on both profiles measured (docs/benchmarks.md). Upstream's
// creates a directory that a layer only implies (d/f without d/) 0755 and
// owned by root, whatever the layers below give it (containerd v2.4.2);
// the unpacker's applier and snapshotter are wrapped (transfer/implied) so
// that it gets what the sequential unpack gives it.
//
// Where no snapshotter can rebase, containerd would unpack one layer at a
// time anyway (and say so at every pull); the hand back, tuned for
// parallel unpack, then stays off too.
func parallelUnpack(configured int, ups []unpack.Platform) bool {
	if configured <= 1 {
		return false
	}
	for _, up := range ups {
		if slices.Contains(up.SnapshotterCapabilities, snapshots.RebaseCap) {
			return true
		}
	}
	return false
}

// containerdUnpacks is the max_concurrent_unpacks containerd's transfer
// service gets: 1 keeps its limiter off and its unpack sequential.
func containerdUnpacks(parallel bool) int {
	if parallel {
		return math.MaxInt32
	}
	return 1
}

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
