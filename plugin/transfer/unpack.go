package transfer

import (
	"fmt"
	"maps"
	"slices"

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
		up, ok, err := unpackPlatform(ic, db, c, uc)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, up)
		}
	}
	return out, nil
}

// loadedSnapshotters returns an unpack platform for the host platform into
// every loaded snapshotter that configured lacks one for, with the default
// differ: remote snapshotters (stargz, SOCI, nydus) among them, declared
// as proxy plugins. Their install docs configure CRI, not unpack_config,
// because stock CRI pulls for them on its local path (client.Pull), which
// unpacks into any loaded snapshotter. Pullwise serves those pulls through
// the transfer service (cri/cripull), so the transfer service must unpack
// into them too, or every such pull fails with "no unpack platforms
// defined". Added after the configured ones, so a configured entry wins.
//
// The default snapshotter is left out: a request that names no snapshotter
// gets the default one where unpack_config lists it, so adding it would
// change where ctr's pulls unpack on a node whose unpack_config leaves it
// out. An explicitly empty unpack_config (no unpacking) gets none.
func loadedSnapshotters(ic *plugin.InitContext, db *metadata.DB, c *config, configured []unpack.Platform) []unpack.Platform {
	if c.UnpackConfiguration != nil && len(c.UnpackConfiguration) == 0 {
		return nil
	}
	loaded, err := ic.GetByType(plugins.SnapshotPlugin)
	if err != nil {
		return nil
	}
	host := platforms.DefaultSpec()
	var out []unpack.Platform
	for _, name := range slices.Sorted(maps.Keys(loaded)) {
		if name == defaults.DefaultSnapshotter || unpacksInto(configured, name, host) {
			continue
		}
		uc := unpackConfig{Platform: platforms.Format(host), Snapshotter: name, Optional: true}
		up, ok, err := unpackPlatform(ic, db, c, uc)
		if err != nil || !ok {
			log.G(ic.Context).WithError(err).WithField("snapshotter", name).Debug("no unpack platform for a loaded snapshotter")
			continue
		}
		out = append(out, up)
	}
	return out
}

// snapshotterKeys names the snapshotters of ups for the host platform, in
// order, once each: what the transfer service unpacks into.
func snapshotterKeys(ups []unpack.Platform) []string {
	var out []string
	for _, up := range ups {
		if up.Platform.Match(platforms.DefaultSpec()) && !slices.Contains(out, up.SnapshotterKey) {
			out = append(out, up.SnapshotterKey)
		}
	}
	return out
}

// unpacksInto reports whether ups has an entry for snapshotter on platform
// p, as containerd's transfer service matches a pull's unpack request.
func unpacksInto(ups []unpack.Platform, snapshotter string, p specs.Platform) bool {
	for _, up := range ups {
		if up.SnapshotterKey == snapshotter && up.Platform.Match(p) {
			return true
		}
	}
	return false
}

// unpackPlatform builds one unpack_config entry; ok is false for an
// optional entry whose snapshotter or differ is missing.
func unpackPlatform(ic *plugin.InitContext, db *metadata.DB, c *config, uc unpackConfig) (unpack.Platform, bool, error) {
	p, err := platforms.Parse(uc.Platform)
	if err != nil {
		return unpack.Platform{}, false, fmt.Errorf("%s: platform configuration %v invalid", plugins.TransferPlugin, uc.Platform)
	}
	sn := db.Snapshotter(uc.Snapshotter)
	if sn == nil {
		if uc.Optional {
			return unpack.Platform{}, false, nil
		}
		return unpack.Platform{}, false, fmt.Errorf("snapshotter %q not found: %w", uc.Snapshotter, errdefs.ErrNotFound)
	}
	applier, err := findApplier(ic, uc, p)
	if err != nil {
		if uc.Optional {
			return unpack.Platform{}, false, nil
		}
		return unpack.Platform{}, false, err
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
	return up, true, nil
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
