//go:build !no_zfs

package builtins

import _ "github.com/containerd/zfs/v2/plugin"
