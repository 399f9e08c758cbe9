// Package criauth reads the credentials a CRI request carries, as CRI does.
package criauth

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Parse reads an AuthConfig as CRI's own pulls do (ParseAuth, internal to
// containerd's CRI plugin), for the registry host that asks: nothing for another server
// address, then user and password, an identity token, or base64 user:pass.
func Parse(auth *runtime.AuthConfig, host string) (user, secret string, err error) {
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
