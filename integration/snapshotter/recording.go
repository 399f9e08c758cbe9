// Package snapshotter serves a proxy snapshotter for integration tests:
// containerd's native snapshotter behind containerd's own gRPC snapshots
// service, on a unix socket, recording the labels each Prepare receives.
// That is what a remote snapshotter (stargz, nydus, SOCI) gets from
// containerd, and what snapshot annotations exist for.
package snapshotter

import (
	"context"
	"maps"
	"net"
	"path/filepath"
	"sync"
	"testing"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/plugins/snapshots/native"
	"google.golang.org/grpc"
)

// Recording is a running proxy snapshotter.
type Recording struct {
	// Socket is its address, for [proxy_plugins.NAME] address.
	Socket string

	mu       sync.Mutex
	prepared []map[string]string
}

// Start serves a recording snapshotter under dir until the test ends.
func Start(t testing.TB, dir string) *Recording {
	t.Helper()
	sn, err := native.NewSnapshotter(filepath.Join(dir, "root"))
	if err != nil {
		t.Fatal(err)
	}
	r := &Recording{Socket: filepath.Join(dir, "snapshotter.sock")}
	l, err := net.Listen("unix", r.Socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(recorder{Snapshotter: sn, r: r}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
		sn.Close()
	})
	return r
}

// Prepared returns the labels of every Prepare so far, in order.
func (r *Recording) Prepared() []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]map[string]string, len(r.prepared))
	for i, l := range r.prepared {
		out[i] = maps.Clone(l)
	}
	return out
}

type recorder struct {
	snapshots.Snapshotter
	r *Recording
}

func (s recorder) Prepare(ctx context.Context, key, parent string, opts ...snapshots.Opt) ([]mount.Mount, error) {
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return nil, err
		}
	}
	s.r.mu.Lock()
	s.r.prepared = append(s.r.prepared, maps.Clone(info.Labels))
	s.r.mu.Unlock()
	return s.Snapshotter.Prepare(ctx, key, parent, opts...)
}
