package transfer

import (
	"fmt"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/platforms"
	"github.com/containerd/plugin"
	specs "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/core/unpack"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/plugins"
)

// unpackPlatforms turns unpack_config into the platforms the transfer
// service unpacks for, with the same semantics as upstream: an entry whose
// snapshotter or differ is missing is an error unless it is optional.
func unpackPlatforms(ic *plugin.InitContext, db *metadata.DB, c *config) ([]unpack.Platform, error) {
	entries := c.UnpackConfiguration
	if entries == nil {
		entries = defaultUnpackConfig()
	}
	var out []unpack.Platform
	for _, uc := range entries {
		p, err := platforms.Parse(uc.Platform)
		if err != nil {
			return nil, fmt.Errorf("%s: platform configuration %v invalid", plugins.TransferPlugin, uc.Platform)
		}
		sn := db.Snapshotter(uc.Snapshotter)
		if sn == nil {
			if uc.Optional {
				continue
			}
			return nil, fmt.Errorf("snapshotter %q not found: %w", uc.Snapshotter, errdefs.ErrNotFound)
		}
		applier, err := findApplier(ic, uc, p)
		if err != nil {
			if uc.Optional {
				continue
			}
			return nil, err
		}
		target := platforms.OnlyOS(p)
		if c.CheckPlatformSupported {
			target = platforms.Only(p)
		}
		up := unpack.Platform{
			Platform:       target,
			SnapshotterKey: uc.Snapshotter,
			Snapshotter:    sn,
			Applier:        applier,
			ConfigType:     uc.ConfigType,
			LayerTypes:     uc.LayerTypes,
		}
		if sp := ic.Plugins().Get(plugins.SnapshotPlugin, uc.Snapshotter); sp != nil {
			up.SnapshotterExports = sp.Meta.Exports
			up.SnapshotterCapabilities = sp.Meta.Capabilities
		}
		out = append(out, up)
	}
	return out, nil
}

// findApplier returns the configured differ, or else the one diff plugin
// that supports platform p, preferring the default differ when several do.
func findApplier(ic *plugin.InitContext, uc unpackConfig, p specs.Platform) (diff.Applier, error) {
	if uc.Differ != "" {
		inst, err := ic.GetByID(plugins.DiffPlugin, uc.Differ)
		if err != nil {
			return nil, fmt.Errorf("failed to get instance for diff plugin %q: %w", uc.Differ, err)
		}
		return inst.(diff.Applier), nil
	}
	var candidates []*plugin.Plugin
	for _, dp := range ic.GetAll() {
		if dp.Registration.Type == plugins.DiffPlugin && supports(dp, p) {
			candidates = append(candidates, dp)
		}
	}
	if len(candidates) > 1 {
		log.G(ic.Context).Warnf("multiple differs match for platform %s, set `differ` option to choose; using %q when available", platforms.Format(p), defaults.DefaultDiffer)
		for i, dp := range candidates {
			if dp.Registration.ID == defaults.DefaultDiffer {
				candidates[0], candidates[i] = candidates[i], candidates[0]
			}
		}
	}
	for _, dp := range candidates {
		inst, err := dp.Instance()
		if plugin.IsSkipPlugin(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("failed to get instance for diff plugin %q: %w", dp.Registration.ID, err)
		}
		return inst.(diff.Applier), nil
	}
	return nil, fmt.Errorf("no matching diff plugins: %w", errdefs.ErrNotFound)
}

// supports matches the differ's own platforms against the requested one, not
// the reverse: a differ for linux/amd64 must not claim linux(+erofs)/amd64.
func supports(dp *plugin.Plugin, p specs.Platform) bool {
	for _, dpp := range dp.Meta.Platforms {
		if platforms.Only(dpp).Match(p) {
			return true
		}
	}
	return false
}
