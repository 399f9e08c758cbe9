//go:build !no_cri

package builtins

import (
	_ "github.com/containerd/containerd/v2/plugins/cri"
	_ "github.com/containerd/containerd/v2/plugins/cri/images"
	_ "github.com/containerd/containerd/v2/plugins/cri/runtime"
)
