package pullwise

import (
	"context"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/core/metadata"
	"github.com/containerd/containerd/v2/plugins"
	"github.com/containerd/log"
	"github.com/containerd/plugin"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pullwise/pullwise/transfer/space"
)

// newLedger admits pulls by disk space, on the content store's filesystem
// and on those of the snapshotters whose data lives under containerd's
// root. A remote snapshotter keeps its own cache elsewhere, and its layers
// may never be fetched: pulls into it are not held back.
func newLedger(ic *plugin.InitContext, c *Config, db *metadata.DB, ratio *space.Ratio) (*space.Ledger, error) {
	root := filepath.Dir(ic.Properties[plugins.PropertyRootDir])
	// The content plugin exports no root; its directory is its URI's.
	content := filepath.Join(root, string(plugins.ContentPlugin)+".content")
	snapshotters := map[string]string{}
	loaded, _ := ic.GetByType(plugins.SnapshotPlugin)
	for name := range loaded {
		p := ic.Plugins().Get(plugins.SnapshotPlugin, name)
		if p == nil {
			continue
		}
		if dir := p.Meta.Exports[plugins.SnapshotterRootDir]; dir != "" && space.Within(dir, root) {
			snapshotters[name] = dir
		}
	}
	free := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "pullwise",
		Name:      "disk_free_bytes",
		Help:      "Free space the pull gate saw on each filesystem pulls write to, at its last check.",
	}, []string{"filesystem"})
	if err := prometheus.Register(free); err != nil {
		return nil, err
	}
	cs := db.ContentStore()
	l := space.New(space.Config{
		Content:        content,
		Snapshotters:   snapshotters,
		ReservePercent: c.DiskReservePercent,
		Timeout:        time.Duration(c.PullQueueTimeout),
		Stat:           space.Statfs,
		Present: func(d digest.Digest) bool {
			_, err := cs.Info(context.Background(), d)
			return err == nil
		},
		Observe: func(fs string, bytes uint64) { free.WithLabelValues(fs).Set(float64(bytes)) },
	}, ratio)
	log.G(ic.Context).WithFields(log.Fields{
		"disk_reserve_percent": c.DiskReservePercent,
		"content":              content,
		"snapshotters":         snapshotters,
	}).Info("pulls admitted by disk space")
	return l, nil
}
