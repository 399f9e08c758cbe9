package transfer

import (
	"runtime"

	"github.com/containerd/platforms"

	"github.com/containerd/containerd/v2/defaults"
)

// config takes the same keys as upstream's transfer plugin, so existing
// [plugins."io.containerd.transfer.v1.local"] sections keep working.
type config struct {
	// Node-wide, as upstream. Pullwise's default is 6, upstream's 3: with
	// a round trip per blob, three leave a link with latency idle part of
	// a burst of pulls (docs/benchmarks-history.md, twelfth round), and
	// the lane gives
	// places to the oldest pull first, so more of them do not spread the
	// link over more pulls.
	MaxConcurrentDownloads      int  `toml:"max_concurrent_downloads"`
	ConcurrentLayerFetchBuffer  int  `toml:"concurrent_layer_fetch_buffer"`
	MaxConcurrentUploadedLayers int  `toml:"max_concurrent_uploaded_layers"`
	CheckPlatformSupported      bool `toml:"check_platform_supported"`
	// Unset means the defaults; set but empty means no unpacking.
	UnpackConfiguration []unpackConfig `toml:"unpack_config,omitempty"`
	RegistryConfigPath  string         `toml:"config_path"`
	// Above 1, the layers of an image are unpacked in parallel where the
	// snapshotter can rebase, as upstream. Upstream's default is 1;
	// Pullwise's is one per CPU (parallelUnpack).
	MaxConcurrentUnpacks int `toml:"max_concurrent_unpacks"`
	// Pullwise's own: inflate gzip layers whole, or else ahead of the tar
	// writer (transfer/gunzip). False leaves them to containerd, which also
	// runs igzip or unpigz for them when either is on PATH.
	GzipReadAhead bool `toml:"gzip_read_ahead"`
	// Pullwise's own: a pull due well before others (smaller, asked for at
	// about the same time) does not wait for their layers' unpacking
	// (lane.Overtaking), nor keeps its slot while they unpack
	// (gate.Handback). False unpacks strictly within the limit, oldest
	// first.
	SmallPullsFirst bool `toml:"small_pulls_first"`
	// Pullwise's own: a blob body of a pull due well after another that
	// is downloading, or waiting for a download place, pauses
	// (lane.Link). False shares the link by connection, as upstream.
	LinkPriority bool `toml:"link_priority"`
	// Pullwise's own: a layer of 64 MiB or more is written while its blob
	// arrives, where the layers of an image are unpacked in parallel
	// (transfer/early). False writes every layer after its last byte, as
	// upstream.
	UnpackWhileDownloading bool `toml:"unpack_while_downloading"`
}

type unpackConfig struct {
	Platform    string   `toml:"platform"`
	Snapshotter string   `toml:"snapshotter"`
	Differ      string   `toml:"differ"`
	ConfigType  string   `toml:"config_type"`
	LayerTypes  []string `toml:"layer_types"`
	Optional    bool     `toml:"optional"`
}

func defaultConfig() *config {
	return &config{
		MaxConcurrentDownloads:      6,
		MaxConcurrentUploadedLayers: 3,
		MaxConcurrentUnpacks:        runtime.NumCPU(),
		GzipReadAhead:               true,
		SmallPullsFirst:             true,
		LinkPriority:                true,
		UnpackWhileDownloading:      true,
	}
}

// defaultUnpackConfig is upstream's Linux default: the default snapshotter
// and differ for the host platform, plus EROFS-native images when the erofs
// snapshotter is available.
func defaultUnpackConfig() []unpackConfig {
	erofs := platforms.DefaultSpec()
	erofs.OSFeatures = []string{"erofs"}
	return []unpackConfig{
		{
			Platform:    platforms.Format(platforms.DefaultSpec()),
			Snapshotter: defaults.DefaultSnapshotter,
			Differ:      defaults.DefaultDiffer,
		},
		{
			Platform:    platforms.FormatAll(erofs),
			Snapshotter: "erofs",
			Differ:      "erofs",
			Optional:    true,
		},
	}
}
