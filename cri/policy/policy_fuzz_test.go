package policy

import (
	"context"
	"testing"

	"github.com/distribution/reference"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// FuzzPullPolicyAnnotation sends CRI PullImage requests with any image name
// and any value of the pod annotation, on the image spec, the sandbox or
// both, through the interceptor. Only the exact value IfNewerNotPresent
// (the image's own annotation first) turns the check on; the node-wide
// setting applies when neither carries it. A name that is no reference is
// InvalidArgument with a message; nothing is Internal or Unknown.
func FuzzPullPolicyAnnotation(f *testing.F) {
	for _, s := range []struct {
		image, imageAnn, podAnn string
		onImage, onPod, node    bool
	}{
		{image: "busybox", imageAnn: "IfNewerNotPresent", onImage: true},
		{image: "busybox", imageAnn: "ifnewernotpresent", onImage: true, node: true},
		{image: "busybox", podAnn: "IfNewerNotPresent", onImage: true, onPod: true},
		{image: "busybox", imageAnn: "Always", podAnn: "IfNewerNotPresent", onImage: true, onPod: true},
		{image: "busybox", podAnn: "IfNewerNotPresent ", onPod: true},
		{image: "UPPER/case", imageAnn: "IfNewerNotPresent", onImage: true},
		{image: "a@sha256:zz", node: true},
		{image: "", imageAnn: "\x00", podAnn: "\xff", onImage: true, onPod: true, node: true},
		{image: "busybox", imageAnn: "IfNewerNotPresent\x00", onImage: true},
	} {
		f.Add(s.image, s.imageAnn, s.podAnn, s.onImage, s.onPod, s.node)
	}
	f.Fuzz(func(t *testing.T, image, imageAnn, podAnn string, onImage, onPod, nodeWide bool) {
		req := &runtime.PullImageRequest{Image: &runtime.ImageSpec{Image: image}, SandboxConfig: &runtime.PodSandboxConfig{}}
		if onImage {
			req.Image.Annotations = map[string]string{Annotation: imageAnn}
		}
		if onPod {
			req.SandboxConfig.Annotations = map[string]string{Annotation: podAnn}
		}
		want := nodeWide
		switch {
		case onImage:
			want = imageAnn == "IfNewerNotPresent"
		case onPod:
			want = podAnn == "IfNewerNotPresent"
		}

		fk := &fake{present: true, digest: localDigest}
		handled := 0
		handler := func(context.Context, any) (any, error) {
			handled++
			return &runtime.PullImageResponse{ImageRef: "sha256:upstream"}, nil
		}
		icpt := NewInterceptor(New(fk.deps(), DefaultRetry), nodeWide).UnaryServerInterceptor()
		resp, err := icpt(context.Background(), req, &grpc.UnaryServerInfo{FullMethod: pullImageMethod}, handler)

		if !want {
			if err != nil || handled != 1 || fk.resolves != 0 || resp.(*runtime.PullImageResponse).GetImageRef() != "sha256:upstream" {
				t.Fatalf("policy should not apply: resp %v err %v, %d upstream calls, %d checks", resp, err, handled, fk.resolves)
			}
			return
		}
		if _, perr := reference.ParseDockerRef(image); perr != nil {
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || st.Message() == "" {
				t.Fatalf("image %q: %v, want InvalidArgument with a message", image, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("image %q: %v", image, err)
		}
		// A local image whose digest the registry confirms: not pulled.
		_, digested := mustParse(t, image).(reference.Digested)
		if handled != 0 || (!digested && fk.resolves != 1) {
			t.Fatalf("image %q: %d upstream pulls, %d checks; want the check only", image, handled, fk.resolves)
		}
	})
}

func mustParse(t *testing.T, s string) reference.Named {
	n, err := reference.ParseDockerRef(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// FuzzPolicyString keeps policy names total: a Policy out of range (from a
// future enum value, say) must print, not panic, in a log line.
func FuzzPolicyString(f *testing.F) {
	for _, p := range []int{0, 3, 4, -1, 99} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p int) {
		if Policy(p).String() == "" {
			t.Fatalf("Policy(%d) has no name", p)
		}
	})
}
