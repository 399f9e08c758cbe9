//go:build !no_btrfs && cgo

package builtins

import _ "github.com/containerd/containerd/v2/plugins/snapshots/btrfs/plugin"
