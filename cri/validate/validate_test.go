package validate

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
)

func TestPullImage(t *testing.T) {
	id := "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name  string
		image string
		auth  *runtime.AuthConfig
		ok    bool
	}{
		{"short name", "busybox", nil, true},
		{"image ID", id, nil, true},
		{"empty", "", nil, false},
		{"upper case", "UPPERCASE:v1", nil, false},
		{"bad digest", "a@sha256:zz", nil, false},
		{"colons", "::", nil, false},
		{"control char", "a\x01b", nil, false},
		{"1 MiB", strings.Repeat("a", 1<<20), nil, false},
		{"auth user:pass", "busybox", &runtime.AuthConfig{Auth: "dTpw"}, true},
		{"auth not base64", "busybox", &runtime.AuthConfig{Auth: "!!!"}, false},
		{"auth without colon", "busybox", &runtime.AuthConfig{Auth: "dXNlcg=="}, false},
		// CRI uses the username first and never decodes auth then.
		{"auth shadowed", "busybox", &runtime.AuthConfig{Username: "u", Auth: "!!!"}, true},
		{"bad server address", "busybox", &runtime.AuthConfig{ServerAddress: "http://[::1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := PullImage(&runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: tc.image}, Auth: tc.auth})
			if tc.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || st.Message() == "" || len(st.Message()) > 1024 {
				t.Fatalf("got %v (message %d bytes), want InvalidArgument with a short message", st.Code(), len(st.Message()))
			}
			if tc.auth.GetAuth() != "" && strings.Contains(st.Message(), tc.auth.GetAuth()) {
				t.Fatalf("message %q repeats the secret", st.Message())
			}
		})
	}
}

func TestInterceptorBoundsNames(t *testing.T) {
	huge := strings.Repeat("a", 1<<20)
	icpt := Interceptor{}.UnaryServerInterceptor()
	called := false
	handler := func(context.Context, any) (any, error) { called = true; return nil, nil }
	for _, req := range []any{
		&api.ImageStatusRequest{Image: &runtime.ImageSpec{Image: huge}},
		&api.ContainerStatusRequest{ContainerId: huge},
		&api.ImagePullProgressRequest{PodSandboxId: huge},
		&api.PullImageRequest{Image: &runtime.ImageSpec{Image: huge}},
	} {
		_, err := icpt(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: "/pullwise.cri.v1alpha1.Pullwise/X"}, handler)
		if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || len(st.Message()) > 1024 || called {
			t.Fatalf("%T: %v (%d bytes), handler called %v; want a short InvalidArgument", req, st.Code(), len(st.Message()), called)
		}
	}
	if _, err := icpt(context.Background(), &api.ContainerStatusRequest{ContainerId: "abc"}, &grpc.UnaryServerInfo{}, handler); err != nil || !called {
		t.Fatalf("a short ID was refused: %v", err)
	}
}
