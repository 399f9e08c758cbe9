package pullwise

import (
	"fmt"
	"time"
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
	// AlwaysPullPolicy is how CRI PullImage treats kubelet's Always:
	// "Always" (stock) or "IfNewerNotPresent".
	AlwaysPullPolicy string `toml:"always_pull_policy"`
	// ProtectPinnedImages refuses removal of pinned images.
	ProtectPinnedImages bool `toml:"protect_pinned_images"`
}

// Values of AlwaysPullPolicy.
const (
	PolicyAlways            = "Always"
	PolicyIfNewerNotPresent = "IfNewerNotPresent"
)

// DefaultConfig returns the defaults shown by `containerd config default`.
func DefaultConfig() *Config {
	return &Config{
		ProgressAddress:     "127.0.0.1",
		ProgressTokenTTL:    Duration(time.Minute),
		AlwaysPullPolicy:    PolicyAlways,
		ProtectPinnedImages: true,
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
	case c.AlwaysPullPolicy != PolicyAlways && c.AlwaysPullPolicy != PolicyIfNewerNotPresent:
		return fmt.Errorf("always_pull_policy must be %q or %q, got %q", PolicyAlways, PolicyIfNewerNotPresent, c.AlwaysPullPolicy)
	}
	return nil
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
