//go:build !no_tracing

package builtins

import (
	_ "github.com/containerd/containerd/v2/pkg/tracing/plugin"
)
