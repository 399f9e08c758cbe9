// Package transfer registers the node's TransferPlugin "local" in place of
// upstream's plugins/transfer. It builds containerd's local transfer service
// from the same config keys and wraps it in Pullwise's transfer.Service, so
// CRI, the transfer gRPC service (ctr) and the Pullwise API all pull through
// Pullwise.
package transfer

import (
	"time"

	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"

	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/containerd/plugin/registry"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/core/transfer/local"
	"github.com/containerd/containerd/v2/core/unpack"
	"github.com/containerd/containerd/v2/pkg/imageverifier"
	"github.com/containerd/containerd/v2/plugins"

	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/applyopts"
	"github.com/pullwise/pullwise/transfer/gate"
	"github.com/pullwise/pullwise/transfer/gunzip"
	"github.com/pullwise/pullwise/transfer/implied"
	"github.com/pullwise/pullwise/transfer/lane"
	"github.com/pullwise/pullwise/transfer/lazy"
	"github.com/pullwise/pullwise/transfer/space"

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
			loaded := loadedSnapshotters(ic, db, c, ups)
			// Layers are applied through Pullwise's lane, oldest pull first.
			// containerd's unpack limiter is on only for parallel unpack
			// (parallelUnpack), and never binds.
			layersAtOnce := unpackLimit(c.MaxConcurrentUnpacks)
			unpacks := lane.New(layersAtOnce)
			if c.SmallPullsFirst {
				unpacks = lane.Overtaking(layersAtOnce, dueSlack)
			}
			parallel := parallelUnpack(c.MaxConcurrentUnpacks, ups)
			ups = append(ups, loaded...)
			// The unpacker's locks on chain IDs, shared by every pull.
			chains := lane.NewKeyedLock()
			dirs := implied.NewDirs()
			ratio := &space.Ratio{}
			for i := range ups {
				a := ups[i].Applier
				if parallel {
					a = implied.Applier{Applier: a, Content: db.ContentStore(), Dirs: dirs}
					ups[i].Snapshotter = implied.Snapshotter{Snapshotter: ups[i].Snapshotter, Dirs: dirs}
				}
				// CRI's apply options (image_pull_with_sync_fs, decryption)
				// reach its pulls' layers through the context
				// (transfer/applyopts).
				ups[i].Applier = lane.Applier{Applier: applyopts.Applier{Applier: space.Applier{Applier: a, Ratio: ratio}}, Lane: unpacks, Waited: chains.Waited}
				ups[i].Snapshotter = lazy.Snapshotter{Snapshotter: ups[i].Snapshotter}
			}
			next := local.NewTransferService(db.ContentStore(), metadata.NewImageStore(db), local.TransferConfig{
				Leases:                      l.(leases.Manager),
				MaxConcurrentDownloads:      c.MaxConcurrentDownloads,
				ConcurrentLayerFetchBuffer:  c.ConcurrentLayerFetchBuffer,
				MaxConcurrentUploadedLayers: c.MaxConcurrentUploadedLayers,
				MaxConcurrentUnpacks:        containerdUnpacks(parallel),
				DuplicationSuppressor:       chains,
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
			tc := transfer.Config{Downloads: lane.New(c.MaxConcurrentDownloads), Unpacks: snapshotterKeys(ups), Ratio: ratio}
			if c.LinkPriority {
				tc.Link = lane.NewLink(dueSlack)
			}
			if parallel {
				// Only one pull at a time unpacks without its slot: with
				// the layers of an image unpacked in parallel, the oldest
				// pulls can use every CPU, and downloads running ahead
				// would take them. One layer at a time, an image cannot,
				// and a slot kept would only idle the link
				// (docs/benchmarks-history.md).
				var slack time.Duration
				if c.SmallPullsFirst {
					slack = dueSlack
				}
				tc.Handback = gate.NewHandback(1, slack)
			}
			if c.RegistryConfigPath != "" {
				tc.HostDirs = []string{c.RegistryConfigPath}
			}
			ts.Configure(tc)
			// Last, so a plugin that failed to load leaves gzip layers to
			// containerd.
			gunzip.Enable(c.GzipReadAhead)
			// Pullwise's default differs from upstream's here, so say at
			// start what a node does rather than leave it to debug lines.
			log.G(ic.Context).WithFields(log.Fields{
				"max_concurrent_downloads": c.MaxConcurrentDownloads,
				"layers_at_once":           layersAtOnce,
				"parallel":                 parallel,
				"gzip_read_ahead":          c.GzipReadAhead,
				"small_pulls_first":        c.SmallPullsFirst,
				"link_priority":            c.LinkPriority,
				"unpack_snapshotters":      tc.Unpacks,
			}).Info("unpack configured")
			if len(loaded) > 0 {
				log.G(ic.Context).WithField("snapshotters", snapshotterKeys(loaded)).
					Info("unpack platforms added for loaded snapshotters that unpack_config does not list, as CRI's local pull path would unpack into them")
			}
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
// dueSlack is how much sooner, in lane.Ticket time, a pull must be due
// than others to go before them, on the link and in unpacking: a second
// at lane.Rate is about 100 MiB, so the images of a deployment burst,
// within that of each other, share as before, while a large image gives
// way to small ones.
const dueSlack = time.Second

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
