package cripull

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"

	"github.com/pullwise/pullwise/cri/criconfig"
)

const (
	mirrorCaps   = docker.HostCapabilityPull | docker.HostCapabilityResolve
	upstreamCaps = docker.HostCapabilityPull | docker.HostCapabilityResolve | docker.HostCapabilityPush | docker.HostCapabilityReferrers
)

type wantHost struct {
	scheme, host, path string
	caps               docker.HostCapabilities
}

// resolveHosts is what containerd's resolver makes of the hosts.toml tree
// under dir for host.
func resolveHosts(t *testing.T, dir, host string) []wantHost {
	t.Helper()
	hosts, err := config.ConfigureHosts(context.Background(), config.HostOptions{
		HostDir: config.HostDirFromRoot(dir),
	})(host)
	if err != nil {
		t.Fatalf("ConfigureHosts(%q): %v", host, err)
	}
	got := make([]wantHost, 0, len(hosts))
	for _, h := range hosts {
		got = append(got, wantHost{scheme: h.Scheme, host: h.Host, path: h.Path, caps: h.Capabilities})
	}
	return got
}

func TestWriteMirrorHostsResolution(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mirrors map[string]criconfig.Mirror
		host    string
		want    []wantHost
	}{
		{
			name: "mirrors in order then upstream default",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"mirror.example:5000", "http://127.0.0.1:5001"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"https", "mirror.example:5000", "/v2", mirrorCaps},
				{"http", "127.0.0.1:5001", "/v2", mirrorCaps},
				{"https", "registry.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "docker.io falls back to registry-1.docker.io",
			mirrors: map[string]criconfig.Mirror{
				"docker.io": {Endpoints: []string{"https://mirror.example"}},
			},
			host: "docker.io",
			want: []wantHost{
				{"https", "mirror.example", "/v2", mirrorCaps},
				{"https", "registry-1.docker.io", "/v2", upstreamCaps},
			},
		},
		{
			name: "endpoint naming the registry itself becomes the server",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"http://registry.example", "https://mirror.example"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"https", "mirror.example", "/v2", mirrorCaps},
				{"http", "registry.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "endpoint path is the API root",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"https://m.example/prefix"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"https", "m.example", "/prefix", mirrorCaps},
				{"https", "registry.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "the registry's own endpoint keeps its path as the API root",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"https://registry.example/prefix"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"https", "registry.example", "/prefix", upstreamCaps},
			},
		},
		{
			name: "a repeated endpoint is written once",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"https://m.example", "m.example"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"https", "m.example", "/v2", mirrorCaps},
				{"https", "registry.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "endpoint path ending in /v2 is kept",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"https://m.example/prefix/v2"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"https", "m.example", "/prefix/v2", mirrorCaps},
				{"https", "registry.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "wildcard applies to any host",
			mirrors: map[string]criconfig.Mirror{
				"*": {Endpoints: []string{"mirror.example"}},
			},
			host: "any.example",
			want: []wantHost{
				{"https", "mirror.example", "/v2", mirrorCaps},
				{"https", "any.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "wildcard applies to docker.io",
			mirrors: map[string]criconfig.Mirror{
				"*": {Endpoints: []string{"mirror.example"}},
			},
			host: "docker.io",
			want: []wantHost{
				{"https", "mirror.example", "/v2", mirrorCaps},
				{"https", "registry-1.docker.io", "/v2", upstreamCaps},
			},
		},
		{
			name: "a host's own entry wins over the wildcard",
			mirrors: map[string]criconfig.Mirror{
				"*":                {Endpoints: []string{"wild.example"}},
				"registry.example": {Endpoints: []string{"own.example"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"https", "own.example", "/v2", mirrorCaps},
				{"https", "registry.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "localhost registry defaults to http",
			mirrors: map[string]criconfig.Mirror{
				"127.0.0.1:5000": {},
			},
			host: "127.0.0.1:5000",
			want: []wantHost{
				{"http", "127.0.0.1:5000", "/v2", upstreamCaps},
			},
		},
		{
			name: "localhost mirror without scheme is http",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"localhost:5001"}},
			},
			host: "registry.example",
			want: []wantHost{
				{"http", "localhost:5001", "/v2", mirrorCaps},
				{"https", "registry.example", "/v2", upstreamCaps},
			},
		},
		{
			name: "host without an entry is untouched",
			mirrors: map[string]criconfig.Mirror{
				"registry.example": {Endpoints: []string{"mirror.example"}},
			},
			host: "other.example",
			want: []wantHost{
				{"https", "other.example", "/v2", upstreamCaps},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "hosts")
			if err := WriteMirrorHosts(dir, tc.mirrors); err != nil {
				t.Fatalf("WriteMirrorHosts: %v", err)
			}
			got := resolveHosts(t, dir, tc.host)
			if len(got) != len(tc.want) {
				t.Fatalf("hosts for %q = %+v, want %+v", tc.host, got, tc.want)
			}
			for i := range tc.want {
				if got[i] != tc.want[i] {
					t.Errorf("host %d for %q = %+v, want %+v", i, tc.host, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestWriteMirrorHostsInvalidEndpoint(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hosts")
	err := WriteMirrorHosts(dir, map[string]criconfig.Mirror{
		"registry.example": {Endpoints: []string{"https://bad host:x"}},
	})
	if err == nil {
		t.Fatal("WriteMirrorHosts with an unparsable endpoint succeeded")
	}
}

func TestWriteMirrorHostsRewrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hosts")
	first := map[string]criconfig.Mirror{
		"a.example":      {Endpoints: []string{"mirror-a.example"}},
		"b.example":      {Endpoints: []string{"mirror-b.example"}},
		"127.0.0.1:5000": {Endpoints: []string{"mirror-l.example"}},
		"*":              {Endpoints: []string{"mirror-any.example"}},
	}
	if err := WriteMirrorHosts(dir, first); err != nil {
		t.Fatalf("first WriteMirrorHosts: %v", err)
	}
	for _, sub := range []string{"a.example", "b.example", "127.0.0.1:5000", "_default"} {
		if _, err := os.Stat(filepath.Join(dir, sub, "hosts.toml")); err != nil {
			t.Fatalf("after first write: %v", err)
		}
	}

	second := map[string]criconfig.Mirror{
		"a.example": {Endpoints: []string{"mirror-a2.example"}},
	}
	if err := WriteMirrorHosts(dir, second); err != nil {
		t.Fatalf("second WriteMirrorHosts: %v", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 1 || names[0] != "a.example" {
		t.Errorf("host dirs after second write = %v, want [a.example]", names)
	}

	for _, tc := range []struct {
		host string
		want []wantHost
	}{
		{"a.example", []wantHost{
			{"https", "mirror-a2.example", "/v2", mirrorCaps},
			{"https", "a.example", "/v2", upstreamCaps},
		}},
		{"b.example", []wantHost{
			{"https", "b.example", "/v2", upstreamCaps},
		}},
	} {
		got := resolveHosts(t, dir, tc.host)
		if len(got) != len(tc.want) {
			t.Fatalf("hosts for %q = %+v, want %+v", tc.host, got, tc.want)
		}
		for i := range tc.want {
			if got[i] != tc.want[i] {
				t.Errorf("host %d for %q = %+v, want %+v", i, tc.host, got[i], tc.want[i])
			}
		}
	}

	if err := WriteMirrorHosts(dir, nil); err != nil {
		t.Fatalf("WriteMirrorHosts(nil): %v", err)
	}
	if got := resolveHosts(t, dir, "a.example"); len(got) != 1 || got[0].host != "a.example" {
		t.Errorf("hosts for a.example after clearing = %+v, want only the registry", got)
	}
}
