package daemon

import (
	"os"
	"testing"

	"github.com/pelletier/go-toml/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfigOptionsLandInTheirTables renders the config and reads it back:
// a key put in the wrong table is silently ignored by containerd, so a test
// or benchmark would measure the default while believing it set something.
func TestConfigOptionsLandInTheirTables(t *testing.T) {
	d := &Daemon{Dir: t.TempDir(), Snapshotter: "overlayfs"}
	p := d.writeConfig(t, Options{
		HostsDir:    "/hosts",
		CRIImages:   "  max_concurrent_downloads = 7",
		Transfer:    "  max_concurrent_unpacks = 2",
		ExtraConfig: "[plugins.\"io.containerd.grpc.v1.pullwise\"]\n  max_parallel_image_pulls = 3",
	})
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	var cfg struct {
		Plugins map[string]map[string]any `toml:"plugins"`
	}
	require.NoError(t, toml.Unmarshal(b, &cfg), "config:\n%s", b)

	criImages := cfg.Plugins["io.containerd.cri.v1.images"]
	assert.EqualValues(t, 7, criImages["max_concurrent_downloads"])
	assert.Equal(t, map[string]any{"config_path": "/hosts"}, criImages["registry"])

	transfer := cfg.Plugins["io.containerd.transfer.v1.local"]
	assert.EqualValues(t, 2, transfer["max_concurrent_unpacks"])
	assert.Equal(t, "/hosts", transfer["config_path"])
	assert.Len(t, transfer["unpack_config"], 1, "the harness's unpack_config stays")

	assert.EqualValues(t, 3, cfg.Plugins["io.containerd.grpc.v1.pullwise"]["max_parallel_image_pulls"])
}
