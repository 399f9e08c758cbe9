package layerdir

import (
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mounts []mount.Mount
		want   string
	}{
		{name: "bind", mounts: []mount.Mount{{Type: "bind", Source: "/s/1/fs", Options: []string{"rbind", "rw"}}}, want: "/s/1/fs"},
		{name: "overlay of a bind (parallel unpack)", mounts: []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"rw", "upperdir=/s/2/fs"}}}, want: "/s/2/fs"},
		{name: "overlay on lower layers (sequential unpack)", mounts: []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"workdir=/s/3/work", "upperdir=/s/3/fs", "lowerdir=/s/2/fs:/s/1/fs"}}}, want: "/s/3/fs"},
		{name: "read-only overlay", mounts: []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{"lowerdir=/s/2/fs:/s/1/fs"}}}},
		{name: "btrfs", mounts: []mount.Mount{{Type: "btrfs", Source: "/dev/sdb", Options: []string{"subvolid=5"}}}},
		{name: "bind of no source", mounts: []mount.Mount{{Type: "bind"}}},
		{name: "two mounts", mounts: []mount.Mount{{Type: "bind", Source: "/a"}, {Type: "bind", Source: "/b"}}},
		{name: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Of(tc.mounts)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("Of = %q, %v; want %q", got, ok, tc.want)
			}
			// A bind names the same directory to both.
			if len(tc.mounts) == 1 && tc.mounts[0].Type == "bind" {
				if got, ok := BindSource(tc.mounts); got != tc.want || ok != (tc.want != "") {
					t.Errorf("BindSource = %q, %v; want %q", got, ok, tc.want)
				}
			}
		})
	}
}
