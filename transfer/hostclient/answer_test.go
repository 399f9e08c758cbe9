package hostclient

import "testing"

func TestParsePath(t *testing.T) {
	for _, tc := range []struct {
		path, kind, repo, ref string
	}{
		{"/v2/team/app/manifests/v1", "manifests", "team/app", "v1"},
		{"/v2/team/app/manifests/sha256:abc", "manifests", "team/app", "sha256:abc"},
		{"/v2/library/busybox/blobs/sha256:abc", "blobs", "library/busybox", "sha256:abc"},
		// override_path mirror keeping its prefix
		{"/v2/proxy-cache/library/nginx/manifests/1.27", "manifests", "proxy-cache/library/nginx", "1.27"},
		{"/registry/mirror/team/app/manifests/v1", "manifests", "registry/mirror/team/app", "v1"},
		// a repository named like the API parts
		{"/v2/org/manifests/app/manifests/v1", "manifests", "org/manifests/app", "v1"},
		{"/v2/team/app/blobs/uploads/", "", "", ""},
		{"/v2/", "", "", ""},
		{"/token", "", "", ""},
	} {
		kind, repo, ref := parsePath(tc.path)
		if kind != tc.kind || repo != tc.repo || ref != tc.ref {
			t.Errorf("parsePath(%q) = %q %q %q, want %q %q %q", tc.path, kind, repo, ref, tc.kind, tc.repo, tc.ref)
		}
	}
}
