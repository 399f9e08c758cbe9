package pullwise

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/peers"
)

// startPeers starts the node's peers, serving the content store's blobs.
// The store is the content plugin's, without namespaces: a blob is the
// same bytes in every namespace, and the peers never learn which
// namespace, or image, holds it.
func startPeers(ic *plugin.InitContext, c PeersConfig, table *health.Table) (*peers.Node, error) {
	cs, err := ic.GetSingle(plugins.ContentPlugin)
	if err != nil {
		return nil, err
	}
	dir := ic.Properties[plugins.PropertyRootDir]
	spool := filepath.Join(dir, "peers-spool")
	if err := os.MkdirAll(spool, 0o700); err != nil {
		return nil, fmt.Errorf("peers: %w", err)
	}
	cfg := peers.DefaultConfig()
	cfg.ListenAddr = c.ListenAddress
	cfg.Bootstrap = c.Bootstrap
	cfg.KeyFile = c.KeyFile
	if cfg.KeyFile == "" {
		cfg.KeyFile = filepath.Join(dir, "peer.key")
	}
	cfg.ClusterKeyFile = c.ClusterKeyFile
	cfg.SpoolDir = spool
	cfg.UploadBytesPerSec = c.UploadBytesPerSecond
	cfg.FindTimeout = time.Duration(c.FindTimeout)
	cfg.ReadTimeout = time.Duration(c.ReadTimeout)
	// A failing peer is remembered with the registries' hosts.
	cfg.Health = table
	node, err := peers.New(ic.Context, cfg, cs.(content.Store))
	if err != nil {
		return nil, err
	}
	if err := prometheus.Register(node.Collector()); err != nil {
		node.Close()
		return nil, fmt.Errorf("register peer metrics: %w", err)
	}
	log.G(ic.Context).WithFields(log.Fields{
		"id":                      node.ID().String(),
		"addresses":               node.Addrs(),
		"bootstrap":               c.Bootstrap,
		"upload_bytes_per_second": c.UploadBytesPerSecond,
	}).Info("peers started")
	return node, nil
}
