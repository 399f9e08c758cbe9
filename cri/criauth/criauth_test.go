package criauth

import (
	"encoding/base64"
	"strings"
	"testing"

	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestParse(t *testing.T) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, tc := range []struct {
		name    string
		auth    *runtime.AuthConfig
		host    string
		user    string
		secret  string
		wantErr bool
	}{
		{name: "nil", host: "reg.example"},
		{name: "empty", auth: &runtime.AuthConfig{}, host: "reg.example"},
		{name: "username wins over token", auth: &runtime.AuthConfig{Username: "u", Password: "p", IdentityToken: "t"}, host: "reg.example", user: "u", secret: "p"},
		{name: "token wins over auth", auth: &runtime.AuthConfig{IdentityToken: "t", Auth: b64("u:p")}, host: "reg.example", secret: "t"},
		{name: "trailing NULs trimmed from password", auth: &runtime.AuthConfig{Auth: b64("u:p\x00\x00")}, host: "reg.example", user: "u", secret: "p"},
		{name: "server address with port", auth: &runtime.AuthConfig{ServerAddress: "https://reg.example:5000", Username: "u", Password: "p"}, host: "reg.example:5000", user: "u", secret: "p"},
		{name: "server address port mismatch", auth: &runtime.AuthConfig{ServerAddress: "https://reg.example:5000", Username: "u", Password: "p"}, host: "reg.example"},
		{name: "unparsable server address", auth: &runtime.AuthConfig{ServerAddress: "https://reg example:x", Username: "u"}, host: "reg.example", wantErr: true},
		{name: "base64 without colon", auth: &runtime.AuthConfig{Auth: b64("nocolon")}, host: "reg.example", wantErr: true},
		{name: "invalid base64", auth: &runtime.AuthConfig{Auth: "%%%"}, host: "reg.example", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			user, secret, err := Parse(tc.auth, tc.host)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("Parse = %q, %q, want an error", user, secret)
				}
				if strings.Contains(err.Error(), "nocolon") {
					t.Errorf("error %q leaks the decoded auth", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if user != tc.user || secret != tc.secret {
				t.Errorf("Parse = %q, %q, want %q, %q", user, secret, tc.user, tc.secret)
			}
		})
	}
}
