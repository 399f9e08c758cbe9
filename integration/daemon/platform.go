package daemon

import "github.com/containerd/platforms"

func hostPlatform() string { return platforms.Format(platforms.DefaultSpec()) }
