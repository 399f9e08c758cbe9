package peers

import (
	"errors"
	"fmt"
	"time"

	"github.com/multiformats/go-multiaddr"

	"github.com/pullwise/pullwise/transfer/health"
)

// Config is what a node needs to join its cluster. It is a plain struct:
// the plugin that reads Pullwise's config section fills it in.
type Config struct {
	// ListenAddr is the multiaddr the node accepts peers on, such as
	// /ip4/0.0.0.0/tcp/5001. Only TCP is served: libp2p private networks
	// do not cover QUIC.
	ListenAddr string
	// Bootstrap lists the peers to join through: static multiaddrs
	// ending in /p2p/<id>, and "dns:name:port" entries whose addresses
	// are looked up at start and every BootstrapInterval (a headless
	// Service, for instance). One reachable entry is enough: the rest
	// of the cluster is found through the DHT.
	Bootstrap []string
	// BootstrapInterval is how often the node looks the entries up
	// again and reconnects while it has few peers.
	BootstrapInterval time.Duration
	// KeyFile holds the node's libp2p identity. It is created (mode
	// 0600) when missing, so the node keeps its peer ID over restarts.
	KeyFile string
	// ClusterKeyFile holds the cluster's pre-shared key, in libp2p's
	// "/key/swarm/psk/1.0.0/" format (see GenerateClusterKey). Every
	// connection is encrypted with it, so a host without it can neither
	// connect, read blobs nor write to the DHT. Required.
	ClusterKeyFile string
	// SpoolDir is where fetched blobs are held while their digest is
	// checked; "" means os.TempDir().
	SpoolDir string
	// UploadBytesPerSec caps the bytes per second served to all peers
	// together; 0 means no cap.
	UploadBytesPerSec int64
	// FindTimeout bounds the time a fetch spends waiting for providers,
	// so that a digest no peer has costs at most this before the caller
	// goes to the registry.
	FindTimeout time.Duration
	// ReadTimeout bounds every wait on a peer: the dial, the answer and
	// each read of the body. A peer silent for longer is given up on.
	ReadTimeout time.Duration
	// Health, when set, is the node's memory of failing hosts: a peer that
	// fails is skipped by every fetch for its cooldown (health.Config).
	Health *health.Table
	// RecordTTL is how long a provider record lives in the DHT. A node
	// announces what it still holds every RecordTTL/2, so a blob that
	// garbage collection removed stops being advertised within
	// RecordTTL. All nodes of a cluster must use the same value.
	RecordTTL time.Duration
}

// DefaultConfig returns the defaults; Bootstrap, KeyFile and
// ClusterKeyFile are left for the operator.
func DefaultConfig() Config {
	return Config{
		ListenAddr:        "/ip4/0.0.0.0/tcp/5001",
		BootstrapInterval: time.Minute,
		FindTimeout:       500 * time.Millisecond,
		ReadTimeout:       5 * time.Second,
		RecordTTL:         10 * time.Minute,
	}
}

// ErrNoClusterKey is returned by New when Config.ClusterKeyFile is empty:
// without it the node would share blobs with any host that can reach it.
var ErrNoClusterKey = errors.New("peers: cluster_key_file is required: without a cluster key any host that can reach this node could read its blobs and write to its DHT (create one with GenerateClusterKey)")

// check reports what is wrong with cfg; zero durations take defaults.
func (cfg *Config) check() error {
	def := DefaultConfig()
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&cfg.BootstrapInterval, def.BootstrapInterval},
		{&cfg.FindTimeout, def.FindTimeout},
		{&cfg.ReadTimeout, def.ReadTimeout},
		{&cfg.RecordTTL, def.RecordTTL},
	} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	switch {
	case cfg.ClusterKeyFile == "":
		return ErrNoClusterKey
	case cfg.KeyFile == "":
		return errors.New("peers: key_file is required, so that the node keeps its peer ID over restarts")
	case cfg.UploadBytesPerSec < 0:
		return fmt.Errorf("peers: upload limit %d bytes/s is negative", cfg.UploadBytesPerSec)
	}
	if _, err := multiaddr.NewMultiaddr(cfg.ListenAddr); err != nil {
		return fmt.Errorf("peers: listen address %q: %w", cfg.ListenAddr, err)
	}
	return nil
}
