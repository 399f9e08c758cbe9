package service

import (
	"encoding/json"
	"fmt"
)

// BypassWarning is what operators are told when CRI pulls skip the transfer
// service.
const BypassWarning = "CRI pulls bypass the transfer service (use_local_image_pull is set, " +
	"or a CRI image option that only the local pull path supports is configured; containerd's log names it): " +
	"Pullwise pull features (pull source, node-wide pull limit, dedupe, progress, IfNewerNotPresent) do not apply to CRI pulls"

// CRIUsesTransfer reads the CRI images plugin's effective config, which that
// plugin updates at init when it falls back to local pulls. The config type
// is internal to containerd, but it is JSON-tagged, so the one field needed
// is read through JSON.
func CRIUsesTransfer(imageConfig any) (bool, error) {
	b, err := json.Marshal(imageConfig)
	if err != nil {
		return false, fmt.Errorf("encode CRI image config: %w", err)
	}
	var c struct {
		UseLocalImagePull *bool `json:"useLocalImagePull"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return false, fmt.Errorf("decode CRI image config: %w", err)
	}
	if c.UseLocalImagePull == nil {
		return false, fmt.Errorf("CRI image config has no useLocalImagePull field")
	}
	return !*c.UseLocalImagePull, nil
}
