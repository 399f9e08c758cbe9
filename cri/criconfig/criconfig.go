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
	// config is not the CRI images plugin's. CRI sets it at init when any
	// option only its local pull path supports is configured.
	UseLocalImagePull *bool `json:"useLocalImagePull"`
	// PinnedImages maps a purpose (such as "sandbox") to an image reference,
	// as configured.
	PinnedImages map[string]string `json:"pinned_images"`

	Snapshotter                string                   `json:"snapshotter"`
	DisableSnapshotAnnotations bool                     `json:"disableSnapshotAnnotations"`
	DiscardUnpackedLayers      bool                     `json:"discardUnpackedLayers"`
	ImagePullWithSyncFs        bool                     `json:"imagePullWithSyncFs"`
	MaxConcurrentDownloads     int                      `json:"maxConcurrentDownloads"`
	ImagePullProgressTimeout   string                   `json:"imagePullProgressTimeout"`
	RuntimePlatforms           map[string]ImagePlatform `json:"runtimePlatforms"`
	Registry                   Registry                 `json:"registry"`
	ImageDecryption            ImageDecryption          `json:"imageDecryption"`
}

// ImageDecryption is CRI's image_decryption section.
type ImageDecryption struct {
	// KeyModel "node" decrypts encrypted layers with the node's keys.
	KeyModel string `json:"keyModel"`
}

// KeyModelNode is the key model of keys kept on the node.
const KeyModelNode = "node"

// ImagePlatform is a runtime handler's snapshotter (runtime_platforms).
type ImagePlatform struct {
	Snapshotter string `json:"snapshotter"`
}

// Registry is CRI's registry section, deprecated keys included: CRI has
// already folded registry.auths into Configs at init.
type Registry struct {
	ConfigPath string                    `json:"configPath"`
	Mirrors    map[string]Mirror         `json:"mirrors"`
	Configs    map[string]RegistryConfig `json:"configs"`
	Headers    map[string][]string       `json:"headers"`
}

// Mirror is a registry.mirrors entry.
type Mirror struct {
	Endpoints []string `json:"endpoint"`
}

// RegistryConfig is a registry.configs entry; only its auth is used by
// CRI's pulls (its TLS settings are not, on either path, in v2.4.2).
type RegistryConfig struct {
	Auth *AuthConfig `json:"auth"`
}

// AuthConfig is a registry.configs auth.
type AuthConfig struct {
	Username      string `json:"username"`
	Password      string `json:"password"`
	Auth          string `json:"auth"`
	IdentityToken string `json:"identitytoken"`
}

// DefaultMaxConcurrentDownloads is CRI's default max_concurrent_downloads;
// any other value sends CRI down its local pull path.
const DefaultMaxConcurrentDownloads = 3

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

// UsesTransfer reports whether CRI's own PullImage calls the transfer
// service.
func (c Images) UsesTransfer() (bool, error) {
	if c.UseLocalImagePull == nil {
		return false, fmt.Errorf("CRI image config has no useLocalImagePull field")
	}
	return !*c.UseLocalImagePull, nil
}

// LocalPullOptions names, as config keys, why CRI's own PullImage takes
// its local pull path: the options containerd v2.4.2's
// CheckLocalImagePullConfigs looks for, or else use_local_image_pull
// itself. CRI logs only the first; an operator wants them all. It is empty
// when CRI pulls through the transfer service.
func (c Images) LocalPullOptions() []string {
	if c.UseLocalImagePull == nil || !*c.UseLocalImagePull {
		return nil
	}
	var out []string
	add := func(set bool, key string) {
		if set {
			out = append(out, key)
		}
	}
	add(!c.DisableSnapshotAnnotations, "disable_snapshot_annotations = false")
	add(c.DiscardUnpackedLayers, "discard_unpacked_layers")
	add(len(c.Registry.Mirrors) > 0, "registry.mirrors")
	add(len(c.Registry.Configs) > 0, "registry.configs (or registry.auths)")
	add(c.MaxConcurrentDownloads != DefaultMaxConcurrentDownloads, "max_concurrent_downloads")
	add(c.ImagePullWithSyncFs, "image_pull_with_sync_fs")
	if len(out) == 0 {
		out = append(out, "use_local_image_pull")
	}
	return out
}
