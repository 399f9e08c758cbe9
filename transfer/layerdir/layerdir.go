// Package layerdir reads, from the mounts containerd's unpacker hands a
// layer's applier, the directory the layer is written to. Both the layer's
// implied directories (transfer/implied) and the lock it is written under
// (transfer/lane's Guards) are known by it.
package layerdir

import (
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
)

// Of is the directory a layer's snapshot mounts write to: a bind mount's
// source (overlayfs's for a layer without a parent, which is every layer
// containerd prepares in parallel mode; the native snapshotter's), or an
// overlay's upper directory (what containerd makes of such a bind for a
// layer above the first in parallel mode, or overlayfs's own mounts on a
// parent). Other
// snapshotters' mounts (btrfs, devmapper, remote ones) name none.
func Of(mounts []mount.Mount) (string, bool) {
	if len(mounts) != 1 {
		return "", false
	}
	switch m := mounts[0]; m.Type {
	case "bind":
		return m.Source, m.Source != ""
	case "overlay":
		return Option(m, "upperdir=")
	}
	return "", false
}

// Option returns the value of an overlay mount's option, such as
// "upperdir=".
func Option(m mount.Mount, prefix string) (string, bool) {
	for _, o := range m.Options {
		if v, ok := strings.CutPrefix(o, prefix); ok {
			return v, v != ""
		}
	}
	return "", false
}
