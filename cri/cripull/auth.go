package cripull

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"

	"github.com/containerd/containerd/v2/core/transfer/registry"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

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
	user, secret, err := parseAuth(auth, host)
	if err != nil {
		return registry.Credentials{}, fmt.Errorf("credentials for %s: %w", host, err)
	}
	return registry.Credentials{Host: host, Username: user, Secret: secret}, nil
}

// parseAuth reads an AuthConfig as CRI does: nothing for another server
// address, then user and password, an identity token, or base64 user:pass.
func parseAuth(auth *runtime.AuthConfig, host string) (user, secret string, err error) {
	if auth == nil {
		return "", "", nil
	}
	if auth.ServerAddress != "" {
		u, err := url.Parse(auth.ServerAddress)
		if err != nil {
			return "", "", fmt.Errorf("parse server address: %w", err)
		}
		if u.Host != host {
			return "", "", nil
		}
	}
	switch {
	case auth.Username != "":
		return auth.Username, auth.Password, nil
	case auth.IdentityToken != "":
		return "", auth.IdentityToken, nil
	case auth.Auth != "":
		decoded, err := base64.StdEncoding.DecodeString(auth.Auth)
		if err != nil {
			return "", "", fmt.Errorf("decode auth: %w", err)
		}
		user, pass, ok := strings.Cut(string(decoded), ":")
		if !ok {
			// Never the decoded value: it is a secret.
			return "", "", fmt.Errorf("decoded auth has no user:password form")
		}
		return user, strings.Trim(pass, "\x00"), nil
	}
	return "", "", nil
}
