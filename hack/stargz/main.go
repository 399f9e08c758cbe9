// Command containerd-stargz-grpc is a minimal stand-in for stargz-snapshotter's
// own containerd-stargz-grpc, for the integration tests' lazy-pulling remote
// snapshotter: that binary lives in the stargz cmd module, which the module
// proxy here does not serve, so this builds the same snapshotter from the
// library module's service package and serves it as a containerd proxy
// plugin on a unix socket. It has no config file, keychains or metrics:
// only what the tests need.
//
// It lives in its own module (hack/stargz) so that stargz's dependencies do
// not move Pullwise's go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/log"
	"github.com/containerd/stargz-snapshotter/service"
	"github.com/containerd/stargz-snapshotter/service/resolver"
	"google.golang.org/grpc"
)

func main() {
	root := flag.String("root", "/var/lib/containerd-stargz-grpc", "directory for the snapshotter's state and mounts")
	address := flag.String("address", "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock", "unix socket to serve the snapshots API on")
	level := flag.String("log-level", "info", "log level: trace, debug, info, warn, error")
	plainHTTP := flag.String("plain-http", "", "comma-separated registry hosts (host:port) to reach over plain HTTP")
	flag.Parse()
	if err := run(*root, *address, *level, *plainHTTP); err != nil {
		fmt.Fprintf(os.Stderr, "containerd-stargz-grpc: %v\n", err)
		os.Exit(1)
	}
}

func run(root, address, level, plainHTTP string) error {
	if err := log.SetLevel(level); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// stargz fetches the TOC and chunks itself, from the host in the
	// image-ref label. Loopback hosts are plain HTTP already
	// (docker.MatchLocalhost); -plain-http says so for any other host, as a
	// mirror of itself marked insecure.
	var cfg service.Config
	cfg.ResolverConfig.Host = map[string]resolver.HostConfig{}
	for _, h := range strings.Split(plainHTTP, ",") {
		if h = strings.TrimSpace(h); h != "" {
			cfg.ResolverConfig.Host[h] = resolver.HostConfig{Mirrors: []resolver.MirrorConfig{{Host: h, Insecure: true}}}
		}
	}
	cfg.NoPrometheus = true

	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	sn, err := service.NewStargzSnapshotterService(ctx, root, &cfg)
	if err != nil {
		return fmt.Errorf("create snapshotter: %w", err)
	}
	// Close unmounts every FUSE mount the snapshotter made.
	defer func() {
		if err := sn.Close(); err != nil {
			log.G(ctx).WithError(err).Warn("close snapshotter")
		}
	}()

	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return err
	}
	if err := os.RemoveAll(address); err != nil {
		return err
	}
	l, err := net.Listen("unix", address)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(srv, snapshotservice.FromSnapshotter(sn))
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	log.G(ctx).WithField("address", address).WithField("root", root).Info("serving stargz snapshotter")

	select {
	case <-ctx.Done():
		log.G(ctx).Info("signal received, stopping")
		srv.GracefulStop()
		return nil
	case err := <-errc:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	}
}
