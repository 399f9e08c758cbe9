package hostclient

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	distref "github.com/distribution/reference"
)

// FuzzHostsFile loads hosts.toml text, override_path included, as every
// pull does, and checks the recorder names repositories the way each
// configured endpoint does: a mirror's own path prefix stays part of the
// repository, containerd's /v2 does not.
func FuzzHostsFile(f *testing.F) {
	for _, s := range []string{
		"server = \"https://registry.example\"\n[host.\"http://127.0.0.1:5000\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
		"[host.\"http://127.0.0.1:5000/v2/proxy-cache\"]\noverride_path = true\n",
		"[host.\"https://mirror.example/registry/mirror\"]\noverride_path = true\ncapabilities = [\"pull\"]\n",
		"[host.\"https://mirror.example/a/../b/\"]\n",
		"[host.\"https://mirror.example/v2\"]\n",
		"[host.\"//\"]\noverride_path = true\n",
		"server = 12\n", "[host]\n", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, hostsFile string) {
		root := t.TempDir()
		dir := filepath.Join(root, "reg.example")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hostsFile), 0o644); err != nil {
			t.Fatal(err)
		}
		hosts, err := config.ConfigureHosts(context.Background(), config.HostOptions{HostDir: config.HostDirFromRoot(root)})("reg.example")
		if err != nil {
			return
		}
		for _, h := range hosts {
			p := h.Path + "/team/app/manifests/v1"
			kind, repo, ref := parsePath(p)
			if kind != "manifests" || ref != "v1" || !strings.HasSuffix(repo, "team/app") {
				t.Fatalf("endpoint %s%s: parsePath(%q) = %q %q %q", h.Host, h.Path, p, kind, repo, ref)
			}
		}
	})
}

// FuzzParsePath splits registry API paths: whatever the path, no panic, and
// a manifest or blob path built from a prefix, a repository and a reference
// splits back into them.
func FuzzParsePath(f *testing.F) {
	for _, s := range [][4]string{
		{"/v2", "team/app", "manifests", "v1"}, {"/v2/proxy-cache", "library/nginx", "manifests", "1.27"},
		{"/registry/mirror", "team/app", "blobs", "sha256:abc"}, {"", "org/manifests/app", "manifests", "v1"},
		{"/v2", "team/app", "blobs", "uploads/"}, {"//", "", "manifests", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	f.Fuzz(func(t *testing.T, prefix, repo, kind, ref string) {
		p := prefix + "/" + repo + "/" + kind + "/" + ref
		gotKind, gotRepo, gotRef := parsePath(p)
		if gotKind == "" {
			if gotRepo != "" || gotRef != "" {
				t.Fatalf("parsePath(%q) = %q %q %q: parts without a kind", p, gotKind, gotRepo, gotRef)
			}
		}
		// Only paths the registry API can have: a reference is one
		// segment, a repository is path components, and neither contains
		// the API's own words as segments.
		named, err := distref.ParseNormalizedNamed("x.example/" + repo)
		if err != nil || distref.Path(named) != repo || (kind != "manifests" && kind != "blobs") ||
			ref == "" || strings.ContainsAny(ref, "/") || strings.Contains(prefix, "/manifests/") || strings.Contains(prefix, "/blobs/") ||
			strings.Contains("/"+repo+"/", "/v2/") {
			return
		}
		segs := strings.FieldsFunc(prefix, func(r rune) bool { return r == '/' })
		var want []string
		dropped := false
		for _, s := range segs {
			if s == "v2" && !dropped {
				dropped = true
				continue
			}
			want = append(want, s)
		}
		want = append(want, repo)
		if strings.Contains(prefix, "//") || strings.HasSuffix(prefix, "/") {
			return // empty segments: no registry path has them
		}
		if gotKind != kind || gotRepo != strings.Join(want, "/") || gotRef != ref {
			t.Fatalf("parsePath(%q) = %q %q %q, want %q %q %q", p, gotKind, gotRepo, gotRef, kind, strings.Join(want, "/"), ref)
		}
	})
}

// FuzzRetryAfter reads Retry-After headers: a wait is never negative, and
// a number of seconds, however large, asks for at least that long.
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "1", "120", "-5", "99999999999", "9223372036854775807", "Wed, 21 Oct 2015 07:28:00 GMT", "soon"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d := retryAfter(v)
		if d < 0 {
			t.Fatalf("retryAfter(%q) = %s", v, d)
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 && n < 1<<31 && d != time.Duration(n)*time.Second {
			t.Fatalf("retryAfter(%q) = %s, want %ds", v, d, n)
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 1<<31 && d < time.Duration(1<<31)*time.Second {
			t.Fatalf("retryAfter(%q) = %s: a huge wait came out short", v, d)
		}
	})
}
