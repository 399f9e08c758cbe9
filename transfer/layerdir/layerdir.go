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
// source, or an overlay's upper directory. The two name one directory:
// in parallel mode on overlayfs, containerd's unpacker turns the bind of
// each layer above the first into an overlay on that source before
// applying it (core/unpack's bindToOverlay), and overlayfs writes a layer
// on a parent to its upper directory. Other snapshotters' mounts (btrfs,
// devmapper, remote ones) name none.
func Of(mounts []mount.Mount) (string, bool) {
	if dir, ok := BindSource(mounts); ok {
		return dir, true
	}
	if len(mounts) != 1 || mounts[0].Type != "overlay" {
		return "", false
	}
	return OverlayOption(mounts[0], "upperdir=")
}

// BindSource is the source of mounts that are one bind mount: a snapshot
// of a single layer, or a view of one. A bind of no source names no
// directory.
func BindSource(mounts []mount.Mount) (string, bool) {
	if len(mounts) != 1 || mounts[0].Type != "bind" {
		return "", false
	}
	return mounts[0].Source, mounts[0].Source != ""
}

// OverlayOption returns the value of an overlay mount's option, such as
// "upperdir=".
func OverlayOption(m mount.Mount, prefix string) (string, bool) {
	for _, o := range m.Options {
		if v, ok := strings.CutPrefix(o, prefix); ok {
			return v, v != ""
		}
	}
	return "", false
}
