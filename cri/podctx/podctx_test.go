package podctx

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/transfer/pullctx"
)

func TestPodReachesHandler(t *testing.T) {
	pod := &runtime.PodSandboxMetadata{Name: "web", Namespace: "prod", Uid: "u1"}
	for _, tc := range []struct {
		name   string
		method string
		req    any
		want   *runtime.PodSandboxMetadata
	}{
		{"pull with pod", PullImageMethod, &runtime.PullImageRequest{SandboxConfig: &runtime.PodSandboxConfig{Metadata: pod}}, pod},
		{"pull without pod", PullImageMethod, &runtime.PullImageRequest{}, nil},
		{"other method", "/runtime.v1.ImageService/ImageStatus", &runtime.ImageStatusRequest{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *runtime.PodSandboxMetadata
			_, err := Interceptor{}.UnaryServerInterceptor()(context.Background(), tc.req, &grpc.UnaryServerInfo{FullMethod: tc.method},
				func(ctx context.Context, _ any) (any, error) { got = pullctx.PodFrom(ctx); return nil, nil })
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("pod %v, want %v", got, tc.want)
			}
		})
	}
}
