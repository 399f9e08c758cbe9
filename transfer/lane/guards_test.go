package lane

import (
	"context"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/errdefs"
)

// dirSnapshotter prepares every snapshot as a bind mount of a directory
// named after its key, as the native snapshotter and containerd's
// overlayfs in parallel mode do; none exists before.
type dirSnapshotter struct {
	snapshots.Snapshotter
}

func (dirSnapshotter) Stat(context.Context, string) (snapshots.Info, error) {
	return snapshots.Info{}, errdefs.ErrNotFound
}

func (dirSnapshotter) Prepare(_ context.Context, key, _ string, _ ...snapshots.Opt) ([]mount.Mount, error) {
	return []mount.Mount{{Type: "bind", Source: "/snapshots/" + key, Options: []string{"rbind", "rw"}}}, nil
}

func (dirSnapshotter) Commit(context.Context, string, string, ...snapshots.Opt) error { return nil }

func (dirSnapshotter) Remove(context.Context, string) error { return nil }

// TestGuards: a layer containerd's unpacker prepares is known by the
// directory its mounts write to, as a bind mount or as the overlay
// containerd makes of it for a layer above the first, by the chain lock
// the unpacker took for it, until its snapshot is committed or removed.
// Snapshots the unpacker did not prepare for a layer are not known.
func TestGuards(t *testing.T) {
	overlay := func(m []mount.Mount) []mount.Mount {
		return []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"rw", "upperdir=" + m[0].Source}}}
	}
	for _, tc := range []struct {
		name   string
		key    string
		labels map[string]string
		mounts func([]mount.Mount) []mount.Mount // what the applier is given
		end    func(s Snapshotter, key string) error
		want   string
	}{
		{name: "the first layer", key: "extract-1 sha256:aa", labels: ref("sha256:aa"), want: "sn://overlayfs/sha256:aa"},
		{name: "a layer above, as an overlay", key: "extract-2 sha256:bb", labels: ref("sha256:bb"), mounts: overlay, want: "sn://overlayfs/sha256:bb"},
		{name: "a layer on its parent, as overlayfs mounts it", key: "extract-6 sha256:ab", labels: ref("sha256:ab"), mounts: func(m []mount.Mount) []mount.Mount {
			return []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"workdir=/w", "upperdir=" + m[0].Source, "lowerdir=/l1:/l2"}}}
		}, want: "sn://overlayfs/sha256:ab"},
		{name: "committed", key: "extract-3 sha256:cc", labels: ref("sha256:cc"), end: func(s Snapshotter, key string) error {
			return s.Commit(context.Background(), "sha256:cc", key)
		}},
		{name: "removed", key: "extract-4 sha256:dd", labels: ref("sha256:dd"), end: func(s Snapshotter, key string) error {
			return s.Remove(context.Background(), key)
		}},
		{name: "a container's snapshot", key: "ctr-rootfs", labels: ref("sha256:ee")},
		{name: "a layer without its chain", key: "extract-5 sha256:ff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewGuards()
			s := Snapshotter{Snapshotter: dirSnapshotter{}, Name: "overlayfs", Guards: g}
			m, err := s.Prepare(context.Background(), tc.key, "", snapshots.WithLabels(tc.labels))
			if err != nil {
				t.Fatal(err)
			}
			if tc.end != nil {
				if err := tc.end(s, tc.key); err != nil {
					t.Fatal(err)
				}
			}
			if tc.mounts != nil {
				m = tc.mounts(m)
			}
			if got := g.lockOf(m); got != tc.want {
				t.Errorf("layer written under %q, want %q", got, tc.want)
			}
			if tc.want == "" && g.len() != 0 {
				t.Errorf("%d snapshots still known", g.len())
			}
		})
	}
	if got := (*Guards)(nil).lockOf([]mount.Mount{{Type: "bind", Source: "/x"}}); got != "" {
		t.Errorf("nil Guards knows %q", got)
	}
}

// len is how many snapshots g knows.
func (g *Guards) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.dirByKey)
}

func ref(chain string) map[string]string {
	return map[string]string{snapshots.LabelSnapshotRef: chain}
}
