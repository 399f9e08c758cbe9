package cripull

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/core/transfer/registry"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criauth"
	"github.com/pullwise/pullwise/cri/criconfig"
)

// credentials answers for a pull what CRI's PullImage would: the request's
// auth, else the host's registry.configs auth (registry.auths folded in).
// containerd exports no part of CRI's own, which is internal.
type credentials struct {
	ref     string
	auth    *runtime.AuthConfig
	configs map[string]criconfig.RegistryConfig
}

// GetCredentials implements registry.CredentialHelper.
func (c credentials) GetCredentials(_ context.Context, ref, host string) (registry.Credentials, error) {
	if ref != c.ref {
		return registry.Credentials{}, fmt.Errorf("credentials asked for %q in a pull of %q", ref, c.ref)
	}
	auth := c.auth
	if auth == nil {
		if a := c.configs[host].Auth; a != nil {
			auth = &runtime.AuthConfig{Username: a.Username, Password: a.Password, Auth: a.Auth, IdentityToken: a.IdentityToken}
		}
	}
	user, secret, err := criauth.Parse(auth, host)
	if err != nil {
		return registry.Credentials{}, fmt.Errorf("credentials for %s: %w", host, err)
	}
	return registry.Credentials{Host: host, Username: user, Secret: secret}, nil
}
