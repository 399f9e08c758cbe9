package pullwise

import (
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
)

func TestConfigDecodeAndValidate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		toml    string
		wantErr string
		check   func(*testing.T, *Config)
	}{
		{name: "defaults", toml: "", check: func(t *testing.T, c *Config) {
			if c.MaxParallelImagePulls != 0 || c.PullQueueTimeout != 0 || c.ProgressAddress != "127.0.0.1" ||
				c.ProgressPort != 0 || time.Duration(c.ProgressTokenTTL) != time.Minute ||
				c.AlwaysPullPolicy != "Always" || !c.ProtectPinnedImages {
				t.Fatalf("unexpected defaults: %+v", c)
			}
		}},
		{name: "durations", toml: "pull_queue_timeout = \"90s\"\nprogress_token_ttl = \"2m\"", check: func(t *testing.T, c *Config) {
			if time.Duration(c.PullQueueTimeout) != 90*time.Second || time.Duration(c.ProgressTokenTTL) != 2*time.Minute {
				t.Fatalf("durations: %s %s", c.PullQueueTimeout, c.ProgressTokenTTL)
			}
		}},
		{name: "bad duration", toml: `pull_queue_timeout = "soon"`, wantErr: "invalid duration"},
		{name: "negative limit", toml: "max_parallel_image_pulls = -1", wantErr: "max_parallel_image_pulls"},
		{name: "bad port", toml: "progress_port = 70000", wantErr: "progress_port"},
		{name: "zero ttl", toml: `progress_token_ttl = "0s"`, wantErr: "progress_token_ttl"},
		{name: "progress server limits", toml: "", check: func(t *testing.T, c *Config) {
			if c.ProgressMaxConnections != 1024 || time.Duration(c.ProgressClientTimeout) != 10*time.Second {
				t.Fatalf("progress server limits: %d %s", c.ProgressMaxConnections, c.ProgressClientTimeout)
			}
		}},
		{name: "zero connections", toml: "progress_max_connections = 0", wantErr: "progress_max_connections"},
		{name: "peers off by default", toml: "", check: func(t *testing.T, c *Config) {
			if c.Peers.Enabled || c.Peers.ListenAddress != "/ip4/0.0.0.0/tcp/5001" || c.Peers.UploadBytesPerSecond != 128<<20 {
				t.Fatalf("peers defaults: %+v", c.Peers)
			}
		}},
		{name: "peers on", toml: "[peers]\nenabled = true\ncluster_key_file = \"/etc/containerd/cluster.key\"\nbootstrap = [\"dns:peers:5001\"]", check: func(t *testing.T, c *Config) {
			if !c.Peers.Enabled || c.Peers.ClusterKeyFile != "/etc/containerd/cluster.key" || len(c.Peers.Bootstrap) != 1 || time.Duration(c.Peers.FindTimeout) != 500*time.Millisecond {
				t.Fatalf("peers: %+v", c.Peers)
			}
		}},
		{name: "peers without a cluster key", toml: "[peers]\nenabled = true", wantErr: "cluster_key_file"},
		{name: "peers with a negative upload cap", toml: "[peers]\nupload_bytes_per_second = -1", wantErr: "upload_bytes_per_second"},
		{name: "peers with no read timeout", toml: "[peers]\nenabled = true\ncluster_key_file = \"k\"\nread_timeout = \"0s\"", wantErr: "read_timeout"},
		{name: "zero client timeout", toml: `progress_client_timeout = "0s"`, wantErr: "progress_client_timeout"},
		{name: "bad policy", toml: `always_pull_policy = "Sometimes"`, wantErr: "always_pull_policy"},
		{name: "IfNewerNotPresent", toml: `always_pull_policy = "IfNewerNotPresent"`},
		{name: "registry health defaults", toml: "", check: func(t *testing.T, c *Config) {
			h := c.Health()
			if h.ResponseTimeout != 15*time.Second || h.ReadTimeout != 30*time.Second ||
				h.Cooldown != 10*time.Second || h.MaxCooldown != 5*time.Minute {
				t.Fatalf("registry health defaults: %+v", h)
			}
		}},
		{name: "registry memory off", toml: `registry_cooldown = "0s"`, check: func(t *testing.T, c *Config) {
			if c.Health().Cooldown != 0 {
				t.Fatalf("cooldown %s", c.RegistryCooldown)
			}
		}},
		{name: "negative response timeout", toml: `registry_response_timeout = "-1s"`, wantErr: "registry_response_timeout"},
		{name: "negative read timeout", toml: `registry_read_timeout = "-1s"`, wantErr: "registry_read_timeout"},
		{name: "negative cooldown", toml: `registry_cooldown = "-1s"`, wantErr: "registry_cooldown"},
		{name: "negative retry wait", toml: "registry_max_retry_wait = \"-1s\"", wantErr: "registry_max_retry_wait"},
		{name: "negative disk reserve", toml: "disk_reserve_percent = -1", wantErr: "disk_reserve_percent"},
		{name: "disk reserve of most of the disk", toml: "disk_reserve_percent = 90", wantErr: "disk_reserve_percent"},
		{name: "max below start", toml: "registry_cooldown = \"1m\"\nregistry_max_cooldown = \"30s\"", wantErr: "registry_max_cooldown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			err := toml.Unmarshal([]byte(tc.toml), c)
			if err == nil {
				err = c.Validate()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

func TestConfigEncodesDurationsAsStrings(t *testing.T) {
	b, err := toml.Marshal(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "progress_token_ttl = '1m0s'") {
		t.Fatalf("encoded config lacks the TTL as a duration string:\n%s", b)
	}
}
