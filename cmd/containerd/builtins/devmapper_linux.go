//go:build !no_devmapper

package builtins

import _ "github.com/containerd/containerd/v2/plugins/snapshots/devmapper/plugin"
