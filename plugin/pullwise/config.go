package pullwise

import (
	"fmt"
	"time"

	"github.com/pullwise/pullwise/transfer/health"
)

// Config is [plugins."io.containerd.grpc.v1.pullwise"]. The defaults keep
// the build a drop-in containerd: nothing is limited until configured.
type Config struct {
	// MaxParallelImagePulls limits image pulls node-wide; 0 is unlimited.
	MaxParallelImagePulls int `toml:"max_parallel_image_pulls"`
	// PullQueueTimeout bounds the wait for a pull slot; 0 leaves it to the
	// caller's deadline.
	PullQueueTimeout Duration `toml:"pull_queue_timeout"`
	// ProgressAddress and ProgressPort are where progress URLs are served;
	// port 0 picks a free one.
	ProgressAddress string `toml:"progress_address"`
	ProgressPort    int    `toml:"progress_port"`
	// ProgressTokenTTL is how long a progress URL stays valid unused.
	ProgressTokenTTL Duration `toml:"progress_token_ttl"`
	// ProgressMaxConnections caps the progress server's connections;
	// ProgressClientTimeout bounds a client's request headers, idle
	// keep-alive and each stream write.
	ProgressMaxConnections int      `toml:"progress_max_connections"`
	ProgressClientTimeout  Duration `toml:"progress_client_timeout"`
	// AlwaysPullPolicy is how CRI PullImage treats kubelet's Always:
	// "Always" (stock) or "IfNewerNotPresent".
	AlwaysPullPolicy string `toml:"always_pull_policy"`
	// ProtectPinnedImages refuses removal of pinned images.
	ProtectPinnedImages bool `toml:"protect_pinned_images"`
	// RegistryResponseTimeout bounds the wait for a registry host's
	// response headers; RegistryReadTimeout bounds a response body that
	// delivers no bytes. A host that exceeds either has failed the request,
	// which goes on with the next host. 0 leaves both to the caller.
	RegistryResponseTimeout Duration `toml:"registry_response_timeout"`
	RegistryReadTimeout     Duration `toml:"registry_read_timeout"`
	// RegistryCooldown is how long a registry host that failed is skipped
	// by every pull on the node; it doubles while the host keeps failing,
	// up to RegistryMaxCooldown. 0 turns this memory off (stock behaviour).
	RegistryCooldown    Duration `toml:"registry_cooldown"`
	RegistryMaxCooldown Duration `toml:"registry_max_cooldown"`
	// RegistryMaxRetryWait bounds the wait a registry host that answers
	// 429 may ask for (Retry-After, or the backoff of its 429 streak):
	// requests to it wait that long, every pull on the node sharing the
	// wait; a longer wait fails them at once with ResourceExhausted. 0
	// retries at once, as stock does.
	RegistryMaxRetryWait Duration `toml:"registry_max_retry_wait"`
	// DiskReservePercent of each filesystem pulls write to (the content
	// store's, the snapshotter's) is kept free: a pull that would eat
	// into it waits for room, within pull_queue_timeout (transfer/space).
	DiskReservePercent int `toml:"disk_reserve_percent"`
	// Peers is [plugins."io.containerd.grpc.v1.pullwise".peers].
	Peers PeersConfig `toml:"peers"`
}

// PeersConfig is the node's peers (transfer/peers): nodes of one cluster
// fetch layer blobs from each other before the registry. Off by default.
type PeersConfig struct {
	Enabled bool `toml:"enabled"`
	// ListenAddress is the libp2p multiaddr peers connect to.
	ListenAddress string `toml:"listen_address"`
	// Bootstrap lists peers to join through: multiaddrs ending in
	// /p2p/<id>, or "dns:name:port" (a headless Service's name).
	Bootstrap []string `toml:"bootstrap"`
	// KeyFile is the node's libp2p identity, made if missing; "" keeps
	// it in the plugin's directory under containerd's root.
	KeyFile string `toml:"key_file"`
	// ClusterKeyFile is the cluster's pre-shared key, required: only
	// nodes holding it can connect.
	ClusterKeyFile string `toml:"cluster_key_file"`
	// UploadBytesPerSecond caps what the node serves to all peers
	// together; 0 is no cap.
	UploadBytesPerSecond int64 `toml:"upload_bytes_per_second"`
	// FindTimeout bounds the look-up of peers holding a blob, what a
	// blob no peer has costs before the registry is asked.
	FindTimeout Duration `toml:"find_timeout"`
	// ReadTimeout bounds every wait on one peer; a peer silent for
	// longer is given up for the next one, or the registry.
	ReadTimeout Duration `toml:"read_timeout"`
	// KeepFor and KeepBytes bound how long, and how much of, the blobs
	// pulls fetch are kept for the peers, even where CRI discards them
	// once unpacked (discard_unpacked_layers); 0 bytes keeps nothing.
	KeepFor   Duration `toml:"keep_for"`
	KeepBytes int64    `toml:"keep_bytes"`
}

// Values of AlwaysPullPolicy.
const (
	PolicyAlways            = "Always"
	PolicyIfNewerNotPresent = "IfNewerNotPresent"
)

// DefaultConfig returns the defaults shown by `containerd config default`.
func DefaultConfig() *Config {
	return &Config{
		ProgressAddress:  "127.0.0.1",
		ProgressTokenTTL: Duration(time.Minute),
		// About 30 KiB a connection at most: 1024 bound the server near
		// 30 MiB, far above one stream per pod being pulled for.
		ProgressMaxConnections: 1024,
		ProgressClientTimeout:  Duration(10 * time.Second),
		AlwaysPullPolicy:       PolicyAlways,
		ProtectPinnedImages:    true,
		// A registry that has not started answering in 15s is not going
		// to; one that sends nothing for 30s mid-body has stalled. Both
		// are far above a healthy registry's latency, even over a WAN.
		RegistryResponseTimeout: Duration(15 * time.Second),
		RegistryReadTimeout:     Duration(30 * time.Second),
		RegistryCooldown:        Duration(10 * time.Second),
		RegistryMaxCooldown:     Duration(5 * time.Minute),
		// Long enough for the seconds a busy registry asks for; a pull
		// limit that asks for minutes or hours fails the pull instead,
		// and kubelet's back-off takes over.
		RegistryMaxRetryWait: Duration(30 * time.Second),
		// Below kubelet's defaults (image GC from 85% used, eviction at
		// 10-15% free), so pulls that kubelet expects to fit still do,
		// while the node keeps room for logs and containers' writes.
		DiskReservePercent: 5,
		Peers: PeersConfig{
			ListenAddress: "/ip4/0.0.0.0/tcp/5001",
			// A tenth of a 10 Gbit/s NIC: a node serving a rollout keeps
			// most of its link for its own pulls and its pods.
			UploadBytesPerSecond: 128 << 20,
			FindTimeout:          Duration(500 * time.Millisecond),
			ReadTimeout:          Duration(5 * time.Second),
			// A rollout's nodes pull within minutes of each other; a
			// few images' worth, which disk_reserve_percent still
			// leaves room beside.
			KeepFor:   Duration(30 * time.Minute),
			KeepBytes: 4 << 30,
		},
	}
}

// Validate rejects values no feature could act on, so a typo fails at start
// instead of being silently ignored.
func (c *Config) Validate() error {
	switch {
	case c.MaxParallelImagePulls < 0:
		return fmt.Errorf("max_parallel_image_pulls must be 0 (unlimited) or more, got %d", c.MaxParallelImagePulls)
	case c.PullQueueTimeout < 0:
		return fmt.Errorf("pull_queue_timeout must not be negative, got %s", c.PullQueueTimeout)
	case c.ProgressPort < 0 || c.ProgressPort > 65535:
		return fmt.Errorf("progress_port must be 0-65535, got %d", c.ProgressPort)
	case c.ProgressTokenTTL <= 0:
		return fmt.Errorf("progress_token_ttl must be positive, got %s", c.ProgressTokenTTL)
	case c.ProgressMaxConnections <= 0:
		return fmt.Errorf("progress_max_connections must be positive, got %d", c.ProgressMaxConnections)
	case c.ProgressClientTimeout <= 0:
		return fmt.Errorf("progress_client_timeout must be positive, got %s", c.ProgressClientTimeout)
	case c.AlwaysPullPolicy != PolicyAlways && c.AlwaysPullPolicy != PolicyIfNewerNotPresent:
		return fmt.Errorf("always_pull_policy must be %q or %q, got %q", PolicyAlways, PolicyIfNewerNotPresent, c.AlwaysPullPolicy)
	case c.RegistryResponseTimeout < 0:
		return fmt.Errorf("registry_response_timeout must not be negative, got %s", c.RegistryResponseTimeout)
	case c.RegistryReadTimeout < 0:
		return fmt.Errorf("registry_read_timeout must not be negative, got %s", c.RegistryReadTimeout)
	case c.RegistryCooldown < 0:
		return fmt.Errorf("registry_cooldown must not be negative, got %s", c.RegistryCooldown)
	case c.RegistryMaxRetryWait < 0:
		return fmt.Errorf("registry_max_retry_wait must not be negative, got %s", c.RegistryMaxRetryWait)
	case c.DiskReservePercent < 0 || c.DiskReservePercent > 50:
		return fmt.Errorf("disk_reserve_percent must be 0-50, got %d", c.DiskReservePercent)
	case c.Peers.Enabled && c.Peers.ClusterKeyFile == "":
		return fmt.Errorf("peers.cluster_key_file is required when peers are enabled: without it any host that reaches this node could read its blobs (docs/peers.md says how to make one)")
	case c.Peers.KeepBytes < 0 || c.Peers.KeepFor < 0:
		return fmt.Errorf("peers.keep_bytes and peers.keep_for must not be negative, got %d and %s", c.Peers.KeepBytes, c.Peers.KeepFor)
	case c.Peers.UploadBytesPerSecond < 0:
		return fmt.Errorf("peers.upload_bytes_per_second must be 0 (no cap) or more, got %d", c.Peers.UploadBytesPerSecond)
	case c.Peers.Enabled && (c.Peers.FindTimeout <= 0 || c.Peers.ReadTimeout <= 0):
		return fmt.Errorf("peers.find_timeout and peers.read_timeout must be positive, got %s and %s", c.Peers.FindTimeout, c.Peers.ReadTimeout)
	case c.RegistryCooldown > 0 && c.RegistryMaxCooldown < c.RegistryCooldown:
		return fmt.Errorf("registry_max_cooldown (%s) must be at least registry_cooldown (%s)", c.RegistryMaxCooldown, c.RegistryCooldown)
	}
	return nil
}

// Health returns the registry health settings.
func (c *Config) Health() health.Config {
	return health.Config{
		Cooldown:        time.Duration(c.RegistryCooldown),
		MaxCooldown:     time.Duration(c.RegistryMaxCooldown),
		ResponseTimeout: time.Duration(c.RegistryResponseTimeout),
		ReadTimeout:     time.Duration(c.RegistryReadTimeout),
		MaxRetryWait:    time.Duration(c.RegistryMaxRetryWait),
	}
}

// Duration reads and writes Go duration strings ("30s", "1m") in TOML.
// containerd's own TOML duration type is internal to its module.
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("invalid duration %q: %w", b, err)
	}
	*d = Duration(v)
	return nil
}
