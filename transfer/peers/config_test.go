package peers

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNewRefusesBadConfig(t *testing.T) {
	key := clusterKey(t)
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no cluster key", func(c *Config) { c.ClusterKeyFile = "" }, "cluster_key_file is required"},
		{"cluster key missing", func(c *Config) { c.ClusterKeyFile = filepath.Join(t.TempDir(), "none") }, "cluster key"},
		{"cluster key malformed", func(c *Config) {
			c.ClusterKeyFile = filepath.Join(t.TempDir(), "bad")
			os.WriteFile(c.ClusterKeyFile, []byte("secret\n"), 0o600)
		}, "is not a /key/swarm/psk/1.0.0/ key"},
		{"no key file", func(c *Config) { c.KeyFile = "" }, "key_file is required"},
		{"bad listen address", func(c *Config) { c.ListenAddr = "0.0.0.0:5001" }, "listen address"},
		{"bootstrap without a peer ID", func(c *Config) { c.Bootstrap = []string{"/ip4/10.0.0.1/tcp/5001"} }, "bootstrap entry"},
		{"dns entry without a port", func(c *Config) { c.Bootstrap = []string{"dns:pullwise-peers"} }, "want dns:name:port"},
		{"negative upload limit", func(c *Config) { c.UploadBytesPerSec = -1 }, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, key)
			tc.edit(&cfg)
			n, err := New(context.Background(), cfg, localStore(t))
			if err == nil {
				n.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
		})
	}
	cfg := testConfig(t, key)
	cfg.ClusterKeyFile = ""
	if _, err := New(context.Background(), cfg, localStore(t)); !errors.Is(err, ErrNoClusterKey) {
		t.Fatalf("%v, want ErrNoClusterKey", err)
	}
}

// TestIdentitySurvivesRestart: the key file is created owner-only and
// gives the node the same peer ID the next time.
func TestIdentitySurvivesRestart(t *testing.T) {
	cfg := testConfig(t, clusterKey(t))
	n, err := New(context.Background(), cfg, localStore(t))
	if err != nil {
		t.Fatal(err)
	}
	id := n.ID()
	n.Close()
	fi, err := os.Stat(cfg.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	n = startNode(t, cfg, localStore(t))
	if n.ID() != id {
		t.Fatalf("peer ID %s after a restart, was %s", n.ID(), id)
	}
}

func TestGenerateClusterKeyKeepsAnExistingKey(t *testing.T) {
	p := clusterKey(t)
	before, _ := os.ReadFile(p)
	if err := GenerateClusterKey(p); err == nil {
		t.Fatal("overwrote a cluster key")
	}
	if after, _ := os.ReadFile(p); string(after) != string(before) {
		t.Fatal("the cluster key changed")
	}
}
