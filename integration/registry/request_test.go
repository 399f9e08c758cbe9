package registry

import "testing"

func TestParsePath(t *testing.T) {
	const dgst = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		path            string
		kind            Kind
		repo, reference string
	}{
		{"/v2/", KindBase, "", ""},
		{"/v2", KindBase, "", ""},
		{"/v2/_catalog", KindOther, "", ""},
		{"/metrics", KindOther, "", ""},
		{"/v2/busybox/manifests/latest", KindManifest, "busybox", "latest"},
		{"/v2/library/busybox/manifests/" + dgst, KindManifest, "library/busybox", dgst},
		{"/v2/a/b/c/blobs/" + dgst, KindBlob, "a/b/c", dgst},
		{"/v2/a/b/blobs/uploads/", KindUpload, "a/b", ""},
		{"/v2/a/b/blobs/uploads", KindUpload, "a/b", ""},
		{"/v2/a/b/blobs/uploads/4f1c-uuid", KindUpload, "a/b", "4f1c-uuid"},
		{"/v2/a/b/tags/list", KindTags, "a/b", ""},
		// Route words inside a repository name do not confuse the parser.
		{"/v2/manifests/blobs/manifests/v1", KindManifest, "manifests/blobs", "v1"},
		{"/v2/tags/list/blobs/" + dgst, KindBlob, "tags/list", dgst},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			kind, repo, ref := parsePath(tt.path)
			if kind != tt.kind || repo != tt.repo || ref != tt.reference {
				t.Errorf("parsePath(%q) = (%q, %q, %q), want (%q, %q, %q)",
					tt.path, kind, repo, ref, tt.kind, tt.repo, tt.reference)
			}
		})
	}
}
