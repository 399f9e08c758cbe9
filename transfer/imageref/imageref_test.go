package imageref

import "testing"

func TestNormalize(t *testing.T) {
	id := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct{ in, want string }{
		{"busybox", "docker.io/library/busybox:latest"},
		{"docker.io/busybox:1.36", "docker.io/library/busybox:1.36"},
		{"127.0.0.1:5000/team/app", "127.0.0.1:5000/team/app:latest"},
		{"127.0.0.1:5000/app@" + id, "127.0.0.1:5000/app@" + id},
		// Tag and digest: the digest decides, as containerd resolves it.
		{"127.0.0.1:5000/app:v1@" + id, "127.0.0.1:5000/app@" + id},
		// An image ID is not a name: it must not become docker.io/library/sha256.
		{id, id},
		{"Not A Reference", "Not A Reference"},
		{"", ""},
	} {
		if got := Normalize(tc.in); got != tc.want {
			t.Errorf("Normalize(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
