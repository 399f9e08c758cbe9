// Package criconfig reads the fields Pullwise needs from the CRI images
// plugin's effective config. That config type is internal to containerd,
// but JSON-tagged, so it is read through JSON. The plugin updates its
// config at init (for example when it falls back to local pulls), so the
// plugin's config after init is the one in force.
package criconfig

import (
	"encoding/json"
	"fmt"
)

// Namespace is the containerd namespace the CRI plugin keeps its images and
// containers in (upstream's constant for it is internal to containerd).
const Namespace = "k8s.io"

// Images holds what Pullwise reads of [plugins."io.containerd.cri.v1.images"].
type Images struct {
	// UseLocalImagePull is nil when the field is missing, which means the
	// config is not the CRI images plugin's.
	UseLocalImagePull *bool `json:"useLocalImagePull"`
	// PinnedImages maps a purpose (such as "sandbox") to an image reference,
	// as configured.
	PinnedImages map[string]string `json:"pinned_images"`
}

// Read decodes the CRI images plugin's config.
func Read(imagesConfig any) (Images, error) {
	var c Images
	b, err := json.Marshal(imagesConfig)
	if err != nil {
		return c, fmt.Errorf("encode CRI image config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("decode CRI image config: %w", err)
	}
	return c, nil
}

// UsesTransfer reports whether CRI pulls reach the transfer service.
func (c Images) UsesTransfer() (bool, error) {
	if c.UseLocalImagePull == nil {
		return false, fmt.Errorf("CRI image config has no useLocalImagePull field")
	}
	return !*c.UseLocalImagePull, nil
}
