package service

import (
	"encoding/json"
	"fmt"
	"slices"
)

// BypassWarning is what operators are told when CRI pulls skip the transfer
// service.
const BypassWarning = "CRI pulls bypass the transfer service (use_local_image_pull is set, " +
	"or a CRI image option that only the local pull path supports is configured; containerd's log names it): " +
	"Pullwise pull features (pull source, node-wide pull limit, dedupe, progress, IfNewerNotPresent) do not apply to CRI pulls"

// criImageConfig holds the fields Pullwise reads from the CRI images
// plugin's effective config. That config type is internal to containerd,
// but JSON-tagged, so it is read through JSON.
type criImageConfig struct {
	UseLocalImagePull *bool             `json:"useLocalImagePull"`
	PinnedImages      map[string]string `json:"pinned_images"`
}

func decodeCRIImageConfig(imageConfig any) (criImageConfig, error) {
	var c criImageConfig
	b, err := json.Marshal(imageConfig)
	if err != nil {
		return c, fmt.Errorf("encode CRI image config: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("decode CRI image config: %w", err)
	}
	return c, nil
}

// CRIUsesTransfer reports whether CRI pulls reach the transfer service. The
// CRI images plugin updates its config at init when it falls back to local
// pulls, so this reads the effective choice.
func CRIUsesTransfer(imageConfig any) (bool, error) {
	c, err := decodeCRIImageConfig(imageConfig)
	if err != nil {
		return false, err
	}
	if c.UseLocalImagePull == nil {
		return false, fmt.Errorf("CRI image config has no useLocalImagePull field")
	}
	return !*c.UseLocalImagePull, nil
}

// CRIPinnedImages returns the images CRI's config pins, the sandbox image
// among them, as configured (not normalized).
func CRIPinnedImages(imageConfig any) ([]string, error) {
	c, err := decodeCRIImageConfig(imageConfig)
	if err != nil {
		return nil, err
	}
	refs := make([]string, 0, len(c.PinnedImages))
	for _, r := range c.PinnedImages {
		if r != "" {
			refs = append(refs, r)
		}
	}
	slices.Sort(refs)
	return refs, nil
}
