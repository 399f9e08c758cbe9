package cripull

import (
	"fmt"
	"maps"
	"slices"

	"github.com/containerd/platforms"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// CheckSnapshotters refuses a CRI config whose pulls the transfer service
// could not unpack: CRI's snapshotter, or a runtime handler's
// (runtime_platforms), missing from unpacks. Stock CRI's local path
// unpacks into any snapshotter, so serving such a node would fail pulls
// that stock serves; refused, the cri-pull interceptor stays out and CRI
// pulls as stock does. The error names the key that would let Pullwise
// serve them.
func CheckSnapshotters(c criconfig.Images, unpacks []string) error {
	need := map[string]string{c.Snapshotter: "snapshotter"}
	for _, h := range slices.Sorted(maps.Keys(c.RuntimePlatforms)) {
		if sn := c.RuntimePlatforms[h].Snapshotter; sn != "" {
			if _, ok := need[sn]; !ok {
				need[sn] = fmt.Sprintf("runtime_platforms.%s.snapshotter", h)
			}
		}
	}
	for _, sn := range slices.Sorted(maps.Keys(need)) {
		if sn == "" || slices.Contains(unpacks, sn) {
			continue
		}
		return fmt.Errorf("CRI's %s %q is not a snapshotter the transfer service can unpack into (it has %v): "+
			"add [[plugins.\"io.containerd.transfer.v1.local\".unpack_config]] with platform = %q and snapshotter = %q, "+
			"or load that snapshotter", need[sn], sn, unpacks, platforms.Format(platforms.DefaultSpec()), sn)
	}
	return nil
}
