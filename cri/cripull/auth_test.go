package cripull

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/transfer/registry"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
)

func TestGetCredentials(t *testing.T) {
	const ref = "reg.example/app:1"
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		name    string
		auth    *runtime.AuthConfig
		configs map[string]criconfig.RegistryConfig
		askRef  string // ref asked for; ref if empty
		host    string
		user    string
		secret  string
		wantErr string // substring of the error; "" for none
		notIn   string // must not appear in the error
	}{
		{
			name: "no auth at all is anonymous",
			host: "reg.example",
		},
		{
			name:   "request username and password for its host",
			auth:   &runtime.AuthConfig{Username: "alice", Password: "pw"},
			host:   "reg.example",
			user:   "alice",
			secret: "pw",
		},
		{
			name:   "request username and password for any host",
			auth:   &runtime.AuthConfig{Username: "alice", Password: "pw"},
			host:   "mirror.example:5000",
			user:   "alice",
			secret: "pw",
		},
		{
			name:   "server address naming the host",
			auth:   &runtime.AuthConfig{ServerAddress: "https://reg.example", Username: "alice", Password: "pw"},
			host:   "reg.example",
			user:   "alice",
			secret: "pw",
		},
		{
			name: "server address naming another host",
			auth: &runtime.AuthConfig{ServerAddress: "https://other.example", Username: "alice", Password: "pw"},
			host: "reg.example",
		},
		{
			name:   "identity token",
			auth:   &runtime.AuthConfig{IdentityToken: "tok"},
			host:   "reg.example",
			secret: "tok",
		},
		{
			name:   "base64 user:pass",
			auth:   &runtime.AuthConfig{Auth: b64("bob:s3cret")},
			host:   "reg.example",
			user:   "bob",
			secret: "s3cret",
		},
		{
			name:   "base64 password containing a colon",
			auth:   &runtime.AuthConfig{Auth: b64("bob:a:b")},
			host:   "reg.example",
			user:   "bob",
			secret: "a:b",
		},
		{
			name:    "base64 without a colon hides the decoded value",
			auth:    &runtime.AuthConfig{Auth: b64("topsecretvalue")},
			host:    "reg.example",
			wantErr: "reg.example",
			notIn:   "topsecretvalue",
		},
		{
			name:    "invalid base64",
			auth:    &runtime.AuthConfig{Auth: "!!!not base64!!!"},
			host:    "reg.example",
			wantErr: "decode auth",
		},
		{
			name: "registry.configs auth when the request has none",
			configs: map[string]criconfig.RegistryConfig{
				"reg.example": {Auth: &criconfig.AuthConfig{Username: "cfg", Password: "cfgpw"}},
			},
			host:   "reg.example",
			user:   "cfg",
			secret: "cfgpw",
		},
		{
			name: "registry.configs base64 auth",
			configs: map[string]criconfig.RegistryConfig{
				"reg.example": {Auth: &criconfig.AuthConfig{Auth: b64("cfg:cfgpw")}},
			},
			host:   "reg.example",
			user:   "cfg",
			secret: "cfgpw",
		},
		{
			name: "registry.configs identity token",
			configs: map[string]criconfig.RegistryConfig{
				"reg.example": {Auth: &criconfig.AuthConfig{IdentityToken: "cfgtok"}},
			},
			host:   "reg.example",
			secret: "cfgtok",
		},
		{
			name: "registry.configs of another host do not apply",
			configs: map[string]criconfig.RegistryConfig{
				"other.example": {Auth: &criconfig.AuthConfig{Username: "cfg", Password: "cfgpw"}},
			},
			host: "reg.example",
		},
		{
			name: "registry.configs without auth",
			configs: map[string]criconfig.RegistryConfig{
				"reg.example": {},
			},
			host: "reg.example",
		},
		{
			name: "request auth wins over registry.configs",
			auth: &runtime.AuthConfig{Username: "alice", Password: "pw"},
			configs: map[string]criconfig.RegistryConfig{
				"reg.example": {Auth: &criconfig.AuthConfig{Username: "cfg", Password: "cfgpw"}},
			},
			host:   "reg.example",
			user:   "alice",
			secret: "pw",
		},
		{
			name: "request auth for another server still wins over registry.configs",
			auth: &runtime.AuthConfig{ServerAddress: "https://other.example", Username: "alice", Password: "pw"},
			configs: map[string]criconfig.RegistryConfig{
				"reg.example": {Auth: &criconfig.AuthConfig{Username: "cfg", Password: "cfgpw"}},
			},
			host: "reg.example",
		},
		{
			name:    "another image's ref",
			auth:    &runtime.AuthConfig{Username: "alice", Password: "pw"},
			askRef:  "reg.example/other:1",
			host:    "reg.example",
			wantErr: "reg.example/other:1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := credentials{ref: ref, auth: tc.auth, configs: tc.configs}
			askRef := tc.askRef
			if askRef == "" {
				askRef = ref
			}
			got, err := c.GetCredentials(context.Background(), askRef, tc.host)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("GetCredentials = %+v, want an error", got)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %q does not mention %q", err, tc.wantErr)
				}
				if tc.notIn != "" && strings.Contains(err.Error(), tc.notIn) {
					t.Errorf("error %q leaks %q", err, tc.notIn)
				}
				return
			}
			if err != nil {
				t.Fatalf("GetCredentials: %v", err)
			}
			want := registry.Credentials{Host: tc.host, Username: tc.user, Secret: tc.secret}
			if got != want {
				t.Errorf("GetCredentials = %+v, want %+v", got, want)
			}
		})
	}
}
