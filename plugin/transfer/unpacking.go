package transfer

import (
	"context"
	"slices"
	"time"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/unpack"
	"github.com/containerd/log"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/applyopts"
	"github.com/pullwise/pullwise/transfer/commits"
	"github.com/pullwise/pullwise/transfer/early"
	"github.com/pullwise/pullwise/transfer/gate"
	"github.com/pullwise/pullwise/transfer/gunzip"
	"github.com/pullwise/pullwise/transfer/implied"
	"github.com/pullwise/pullwise/transfer/lane"
	"github.com/pullwise/pullwise/transfer/lazy"
	"github.com/pullwise/pullwise/transfer/space"
)

// unpacking is how the node's pulls apply their layers: the unpack
// platforms, each wrapped so that its layers go through Pullwise's lane,
// and what the lane shares with the transfer service.
type unpacking struct {
	platforms    []unpack.Platform
	layersAtOnce int
	// parallel: containerd applies the layers of an image at once
	// (parallelUnpack).
	parallel bool
	// unpacks are the places to write layers in, shared by every
	// platform's applier.
	unpacks *lane.Lane
	// chains are the unpacker's locks on blobs and chain IDs, shared by
	// every pull.
	chains *lane.KeyedLock
	// costs are what layers cost to write here, learned as they are.
	costs *lane.Costs
	// inflight are the pulls past the gate, to which work behind gives
	// way while tasks wait for a CPU; noPressure says why it never does.
	inflight   *lane.InFlight
	noPressure error
	// link orders blob bodies on the node's link (nil: by arrival).
	link *lane.Link
	// early writes large layers while they arrive (nil: after).
	early  *early.Node
	ratio  *space.Ratio
	loaded []unpack.Platform // added for snapshotters unpack_config leaves out
}

// newUnpacking wraps the configured platforms, and those added for loaded
// snapshotters, in that order. Layers are applied through the lane, oldest
// pull first; containerd's unpack limiter is on only for parallel unpack,
// and never binds.
func newUnpacking(c *config, db *metadata.DB, turns *commits.Turns, configured, loaded []unpack.Platform) *unpacking {
	u := &unpacking{
		layersAtOnce: unpackLimit(c.MaxConcurrentUnpacks),
		parallel:     parallelUnpack(c.MaxConcurrentUnpacks, configured),
		costs:        lane.NewCosts(),
		ratio:        &space.Ratio{},
		loaded:       loaded,
	}
	u.unpacks = lane.New(u.layersAtOnce)
	if c.SmallPullsFirst {
		u.unpacks = lane.Overtaking(u.layersAtOnce, lane.Slack)
		var cpu *lane.Pressure
		cpu, u.noPressure = lane.NewPressure("/proc/pressure/cpu")
		u.inflight = lane.NewInFlight(cpu, lane.Slack)
		u.unpacks.GiveWay(u.inflight)
	}
	if c.LinkPriority {
		u.link = lane.NewLink(lane.Slack)
		u.link.GiveWay(u.inflight)
	}
	// A pull holding a lock on a blob or chain ID that an earlier pull
	// waits on lends that pull's due to its layers waiting in the lane
	// and its writes waiting for their turn: the blob's commit, the
	// snapshot's, are made under the lock.
	u.chains = lane.NewKeyedLock(u.unpacks, turns)
	// The layer a chain's lock is taken for, known to the lane, takes
	// extra places by the due its waiters lend.
	var guards *lane.Guards
	if c.SmallPullsFirst {
		guards = lane.NewGuards()
	}
	// Only the layers containerd unpacks in parallel are read through
	// Pullwise's own applier (transfer/implied), which can read a blob as
	// it arrives.
	if c.UnpackWhileDownloading && u.parallel {
		u.early = &early.Node{
			Cost: func(mediaType string, size int64) time.Duration {
				return u.costs.Of([]ocispec.Descriptor{{MediaType: mediaType, Size: size}})
			},
			Yield: u.inflight.Yield,
		}
	}
	dirs := implied.NewDirs()
	for _, up := range append(configured, loaded...) {
		up.Snapshotter = commits.Snapshotter{Snapshotter: up.Snapshotter, Turns: turns}
		a := up.Applier
		if u.parallel {
			a = implied.Applier{Applier: a, Content: early.Provider{Provider: db.ContentStore()}, Dirs: dirs}
			up.Snapshotter = implied.Snapshotter{Snapshotter: up.Snapshotter, Dirs: dirs}
		}
		// A gzip layer's reader learns its blob's size (transfer/gunzip);
		// clipped, so that platforms never share what is appended.
		up.ApplyOpts = append(slices.Clip(up.ApplyOpts), gunzip.WithBlobSize())
		// CRI's apply options (image_pull_with_sync_fs, decryption) reach
		// its pulls' layers through the context (transfer/applyopts).
		up.Applier = lane.Applier{Applier: applyopts.Applier{Applier: space.Applier{Applier: a, Ratio: u.ratio}}, Lane: u.unpacks, Costs: u.costs, Guards: guards}
		if u.early != nil {
			up.Applier = early.Applier{Applier: up.Applier, Node: u.early, Reads: implied.Reads}
		}
		if guards != nil {
			up.Snapshotter = lane.Snapshotter{Snapshotter: up.Snapshotter, Name: up.SnapshotterKey, Guards: guards}
		}
		up.Snapshotter = lazy.Snapshotter{Snapshotter: up.Snapshotter}
		u.platforms = append(u.platforms, up)
	}
	return u
}

// serviceConfig is what Pullwise's transfer service shares with the
// unpacking, from the config.
func (u *unpacking) serviceConfig(c *config) transfer.Config {
	tc := transfer.Config{Downloads: lane.New(c.MaxConcurrentDownloads), Unpacks: snapshotterKeys(u.platforms), Ratio: u.ratio, Costs: u.costs, InFlight: u.inflight, Link: u.link, Early: u.early}
	if u.parallel {
		var slack time.Duration
		if c.SmallPullsFirst {
			slack = lane.Slack
		}
		tc.Handback = gate.NewHandback(earlyUnpacks, slack)
	}
	if c.RegistryConfigPath != "" {
		tc.HostDirs = []string{c.RegistryConfigPath}
	}
	return tc
}

// earlyUnpacks is how many pulls at once unpack without their slot where
// an image's layers are unpacked in parallel: one, since such a pull can
// use every CPU, and downloads running ahead of it would take them. One
// layer at a time, an image cannot, and a slot kept would only idle the
// link, so there every pull gives its slot back when fetched
// (docs/benchmarks-history.md has the rounds that chose this, and one
// where a budget of cost in its place, a second's writing per unpack
// place, bought nothing an A/B could tell from the noise).
const earlyUnpacks = 1

// log says at start what the node does: Pullwise's defaults differ from
// upstream's here, which debug lines would leave to guesswork.
func (u *unpacking) log(ctx context.Context, c *config) {
	log.G(ctx).WithFields(log.Fields{
		"max_concurrent_downloads": c.MaxConcurrentDownloads,
		"layers_at_once":           u.layersAtOnce,
		"parallel":                 u.parallel,
		"gzip_read_ahead":          c.GzipReadAhead,
		"small_pulls_first":        c.SmallPullsFirst,
		"link_priority":            c.LinkPriority,
		"unpack_while_downloading": u.early != nil,
		"cpu_pressure":             u.inflight != nil && u.noPressure == nil,
		"unpack_snapshotters":      snapshotterKeys(u.platforms),
	}).Info("unpack configured")
	if u.noPressure != nil {
		log.G(ctx).WithError(u.noPressure).Info("the kernel keeps no CPU pressure: pulls give way to pulls ahead for their places and the link only")
	}
	if len(u.loaded) > 0 {
		log.G(ctx).WithField("snapshotters", snapshotterKeys(u.loaded)).
			Info("unpack platforms added for loaded snapshotters that unpack_config does not list, as CRI's local pull path would unpack into them")
	}
}
