package version

import (
	"runtime/debug"
	"testing"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

const commit = "624762d6c1f0a9b8e7d6c5b4a3f2e1d0c9b8a7f6"

func TestRuntimeVersion(t *testing.T) {
	for _, tc := range []struct {
		name, version, commit, want string
	}{
		{"no tag", "624762d", commit, "v2.4.2+pullwise.624762d"},
		{"no tag, modified tree", "624762d.m", commit + ".m", "v2.4.2+pullwise.624762d.m"},
		{"exactly a tag", "v0.3.0", commit, "v2.4.2+pullwise.v0.3.0.624762d"},
		{"after a tag", "v0.3.0-4-g624762d", commit, "v2.4.2+pullwise.v0.3.0-4-g624762d"},
		{"plain go build", "", commit, "v2.4.2+pullwise.624762d"},
		{"outside git", "", "", "v2.4.2+pullwise.dev"},
		{"odd tag", "v0.3.0_rc/1", commit, "v2.4.2+pullwise.v0.3.0-rc-1.624762d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := runtimeVersion("v2.4.2", tc.version, tc.commit)
			if got != tc.want {
				t.Fatalf("runtimeVersion = %q, want %q", got, tc.want)
			}
			// Kubelet's own parse (kuberuntime newRuntimeVersion): semver
			// first, and the node's containerRuntimeVersion is its String().
			v, err := utilversion.ParseSemantic(got)
			if err != nil {
				t.Fatalf("kubelet cannot parse %q: %v", got, err)
			}
			if v.Major() != 2 || v.Minor() != 4 || v.Patch() != 2 || v.PreRelease() != "" {
				t.Errorf("%q parses as %v, not as the upstream release", got, v)
			}
			if v.String() != got[1:] {
				t.Errorf("node status would show %q, want %q", v.String(), got[1:])
			}
		})
	}
}

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		Deps: []*debug.Module{
			{Path: "github.com/containerd/log", Version: "v0.2.0"},
			{Path: "github.com/containerd/containerd/v2", Version: "v2.4.2"},
		},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: commit},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	got := fromBuildInfo(bi)
	if got.upstream != "v2.4.2" || got.commit != commit+".m" {
		t.Fatalf("fromBuildInfo = %+v", got)
	}
	bi.Deps[1].Replace = &debug.Module{Path: "example.com/fork", Version: "v2.4.3-fork"}
	if got := fromBuildInfo(bi); got.upstream != "v2.4.3-fork" {
		t.Fatalf("replaced module: upstream = %q", got.upstream)
	}
	bi.Deps[1].Replace = &debug.Module{Path: "../containerd"}
	if got := fromBuildInfo(bi); got.upstream != "v2.4.2" {
		t.Fatalf("module replaced by a directory: upstream = %q, want the required version", got.upstream)
	}
}
