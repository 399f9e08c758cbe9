// Package imageref holds the node's one notion of "the same image name":
// config values, CRI requests, ctr pulls and image records all name images
// in their own spelling (busybox, docker.io/busybox:latest), and the gate's
// bypass list, the progress hub and the pins must agree on them.
package imageref

import (
	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
)

// Normalize returns ref in containerd's full form
// (docker.io/library/busybox:latest). A name that is not a reference comes
// back unchanged, so it still matches itself and nothing else. That covers
// CRI's image ID records ("sha256:…"), which would otherwise parse as the
// repository docker.io/library/sha256 and match a pin by accident.
func Normalize(ref string) string {
	if _, err := digest.Parse(ref); err == nil {
		return ref
	}
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return ref
	}
	return named.String()
}
