package cripull

import (
	"strings"
	"testing"

	"github.com/pullwise/pullwise/cri/criconfig"
)

func TestCheckSnapshotters(t *testing.T) {
	for _, tc := range []struct {
		name    string
		config  criconfig.Images
		unpacks []string
		refused string // a word the error must hold; "" for none
	}{
		{name: "default snapshotter", config: criconfig.Images{Snapshotter: "overlayfs"}, unpacks: []string{"overlayfs"}},
		{name: "remote snapshotter listed", config: criconfig.Images{Snapshotter: "stargz"}, unpacks: []string{"overlayfs", "stargz"}},
		{name: "snapshotter missing", config: criconfig.Images{Snapshotter: "stargz"}, unpacks: []string{"overlayfs"}, refused: `snapshotter = "stargz"`},
		{
			name: "runtime handler's snapshotter missing",
			config: criconfig.Images{Snapshotter: "overlayfs", RuntimePlatforms: map[string]criconfig.ImagePlatform{
				"runc-lazy": {Snapshotter: "soci"}, "runc": {}}},
			unpacks: []string{"overlayfs"},
			refused: "runtime_platforms.runc-lazy.snapshotter",
		},
		{name: "no unpacking at all", config: criconfig.Images{Snapshotter: "overlayfs"}, refused: "unpack_config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckSnapshotters(tc.config, tc.unpacks)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("error %v, want one naming %q", err, tc.refused)
			}
		})
	}
}
