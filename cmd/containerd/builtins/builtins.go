// Package builtins loads the plugins of this containerd build: upstream's
// builtins for Linux with two packages replaced by Pullwise's (the gRPC
// server and the transfer plugin), plus the Pullwise plugins.
// builtins_test.go fails when upstream's list and this one drift apart.
package builtins

import (
	// Pullwise replacements and additions.
	_ "github.com/pullwise/pullwise/plugin/pinning"
	_ "github.com/pullwise/pullwise/plugin/pullwise"
	_ "github.com/pullwise/pullwise/plugin/server"
	_ "github.com/pullwise/pullwise/plugin/sweep"
	_ "github.com/pullwise/pullwise/plugin/transfer"

	// Upstream, except plugins/server/grpc and plugins/transfer.
	_ "github.com/containerd/containerd/v2/core/runtime/v2"
	_ "github.com/containerd/containerd/v2/plugins/content/local/plugin"
	_ "github.com/containerd/containerd/v2/plugins/events"
	_ "github.com/containerd/containerd/v2/plugins/gc"
	_ "github.com/containerd/containerd/v2/plugins/imageverifier"
	_ "github.com/containerd/containerd/v2/plugins/leases"
	_ "github.com/containerd/containerd/v2/plugins/metadata"
	_ "github.com/containerd/containerd/v2/plugins/mount"
	_ "github.com/containerd/containerd/v2/plugins/mount/fsview/erofs"
	_ "github.com/containerd/containerd/v2/plugins/nri"
	_ "github.com/containerd/containerd/v2/plugins/restart"
	_ "github.com/containerd/containerd/v2/plugins/sandbox"
	_ "github.com/containerd/containerd/v2/plugins/server/debug"
	_ "github.com/containerd/containerd/v2/plugins/server/metrics"
	_ "github.com/containerd/containerd/v2/plugins/server/ttrpc"
	_ "github.com/containerd/containerd/v2/plugins/services/containers"
	_ "github.com/containerd/containerd/v2/plugins/services/content"
	_ "github.com/containerd/containerd/v2/plugins/services/diff"
	_ "github.com/containerd/containerd/v2/plugins/services/events"
	_ "github.com/containerd/containerd/v2/plugins/services/healthcheck"
	_ "github.com/containerd/containerd/v2/plugins/services/images"
	_ "github.com/containerd/containerd/v2/plugins/services/introspection"
	_ "github.com/containerd/containerd/v2/plugins/services/leases"
	_ "github.com/containerd/containerd/v2/plugins/services/mounts"
	_ "github.com/containerd/containerd/v2/plugins/services/namespaces"
	_ "github.com/containerd/containerd/v2/plugins/services/opt"
	_ "github.com/containerd/containerd/v2/plugins/services/sandbox"
	_ "github.com/containerd/containerd/v2/plugins/services/snapshots"
	_ "github.com/containerd/containerd/v2/plugins/services/streaming"
	_ "github.com/containerd/containerd/v2/plugins/services/tasks"
	_ "github.com/containerd/containerd/v2/plugins/services/transfer"
	_ "github.com/containerd/containerd/v2/plugins/services/version"
	_ "github.com/containerd/containerd/v2/plugins/services/warning"
	_ "github.com/containerd/containerd/v2/plugins/streaming"
)
