package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/cri/policy"
)

// TestBadInput sends what a broken or hostile client might through CRI and
// the Pullwise API: empty, 1 MiB and malformed image names, unknown pull
// policies, odd pod annotations, undecodable auth. Each must be refused with
// InvalidArgument or NotFound and a message (status requests may also
// answer "no such image" the CRI way), never Internal or Unknown, never a
// panic, and the daemon must keep answering.
func TestBadInput(t *testing.T) {
	e := newEnv(t, envOptions{})
	cri := criapi.NewImageServiceClient(e.conn)
	missing := e.upstream.Host() + "/no/such:v1"
	huge := strings.Repeat("a", 1<<20)

	// refused checks err is a refusal with a reason; okToo admits success,
	// for status and removal requests about an image that is not there.
	refused := func(t *testing.T, what string, err error, okToo bool) {
		t.Helper()
		st, _ := status.FromError(err)
		switch {
		case err == nil && okToo:
		case st.Code() == codes.InvalidArgument || st.Code() == codes.NotFound:
			if st.Message() == "" {
				t.Errorf("%s: %s without a message", what, st.Code())
			}
			if len(st.Message()) > 4096 {
				t.Errorf("%s: %s message of %d bytes", what, st.Code(), len(st.Message()))
			}
		default:
			t.Errorf("%s: %v (code %s), want InvalidArgument or NotFound", what, err, st.Code())
		}
	}
	call := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 30*time.Second)
	}

	names := []struct{ name, image string }{
		{"empty", ""},
		{"1 MiB", huge},
		{"upper case", "UPPERCASE:v1"},
		{"bad digest", "a@sha256:zz"},
		{"colons", "::"},
		{"control char", "app\x01:v1"},
		{"NUL", "app\x00:v1"},
		{"absent", missing},
	}
	for _, n := range names {
		t.Run("image "+n.name, func(t *testing.T) {
			ctx, cancel := call()
			defer cancel()
			spec := &criapi.ImageSpec{Image: n.image}
			_, err := cri.PullImage(ctx, &criapi.PullImageRequest{Image: spec})
			refused(t, "CRI PullImage", err, false)
			_, err = cri.ImageStatus(ctx, &criapi.ImageStatusRequest{Image: spec, Verbose: true})
			refused(t, "CRI ImageStatus", err, true)
			_, err = cri.RemoveImage(ctx, &criapi.RemoveImageRequest{Image: spec})
			refused(t, "CRI RemoveImage", err, true)
			for _, p := range []api.PullPolicy{api.PullPolicy_ALWAYS, api.PullPolicy_IF_NEWER_NOT_PRESENT, api.PullPolicy_NEVER} {
				_, err = e.pullwise.PullImage(ctx, &api.PullImageRequest{Image: spec, PullPolicy: p})
				if p == api.PullPolicy_NEVER && n.image == missing {
					// A valid name, absent, with Never: not bad input.
					if status.Code(err) != codes.FailedPrecondition {
						t.Errorf("Pullwise PullImage NEVER of an absent image: %v, want FailedPrecondition", err)
					}
					continue
				}
				refused(t, "Pullwise PullImage "+p.String(), err, false)
			}
			_, err = e.pullwise.ImageStatus(ctx, &api.ImageStatusRequest{Image: spec, Verbose: true})
			refused(t, "Pullwise ImageStatus", err, false)
			_, err = e.pullwise.ImagePullProgress(ctx, &api.ImagePullProgressRequest{Image: n.image})
			// A valid name of an image not being pulled gets a URL: the
			// pull may start after the watcher.
			refused(t, "Pullwise ImagePullProgress image", err, n.image == missing)
			_, err = e.pullwise.ImagePullProgress(ctx, &api.ImagePullProgressRequest{PodSandboxId: n.image})
			refused(t, "Pullwise ImagePullProgress pod", err, false)
			_, err = e.pullwise.ImagePullProgress(ctx, &api.ImagePullProgressRequest{ContainerId: n.image})
			refused(t, "Pullwise ImagePullProgress container", err, false)
			_, err = e.pullwise.ContainerStatus(ctx, &api.ContainerStatusRequest{ContainerId: n.image, Verbose: true})
			refused(t, "Pullwise ContainerStatus", err, false)
		})
	}

	t.Run("unknown pull policy", func(t *testing.T) {
		for _, p := range []int32{5, 99, -1, 1 << 30} {
			ctx, cancel := call()
			_, err := e.pullwise.PullImage(ctx, &api.PullImageRequest{Image: &criapi.ImageSpec{Image: missing}, PullPolicy: api.PullPolicy(p)})
			cancel()
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("pull_policy %d: %v, want InvalidArgument", p, err)
			}
		}
	})

	t.Run("odd annotations", func(t *testing.T) {
		for _, v := range []string{"", "\x00", "ifnewernotpresent", "IfNewerNotPresent ", huge, policy.IfNewerNotPresent.String()} {
			for _, image := range []string{missing, "::"} {
				ann := map[string]string{policy.Annotation: v}
				for where, req := range map[string]*criapi.PullImageRequest{
					"image": {Image: &criapi.ImageSpec{Image: image, Annotations: ann}},
					"pod":   {Image: &criapi.ImageSpec{Image: image}, SandboxConfig: &criapi.PodSandboxConfig{Annotations: ann}},
				} {
					ctx, cancel := call()
					_, err := cri.PullImage(ctx, req)
					cancel()
					refused(t, "CRI PullImage "+image+" with "+where+" annotation "+quoteShort(v), err, false)
				}
			}
		}
	})

	t.Run("undecodable auth", func(t *testing.T) {
		for _, auth := range []*criapi.AuthConfig{{Auth: "!!!"}, {Auth: "dXNlcg=="}, {ServerAddress: "http://[::1"}} {
			ctx, cancel := call()
			start := time.Now()
			_, err := cri.PullImage(ctx, &criapi.PullImageRequest{Image: &criapi.ImageSpec{Image: missing}, Auth: auth})
			if status.Code(err) != codes.InvalidArgument || time.Since(start) > 10*time.Second {
				t.Errorf("CRI PullImage with auth %v: %v after %s, want InvalidArgument at once", auth, err, time.Since(start))
			}
			_, err = e.pullwise.PullImage(ctx, &api.PullImageRequest{Image: &criapi.ImageSpec{Image: missing}, Auth: auth})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("Pullwise PullImage with auth %v: %v, want InvalidArgument", auth, err)
			}
			cancel()
		}
	})

	ctx, cancel := call()
	defer cancel()
	if _, err := e.pullwise.Version(ctx, &api.VersionRequest{}); err != nil {
		t.Fatalf("Pullwise Version after bad input: %v", err)
	}
	if _, err := cri.ListImages(ctx, &criapi.ListImagesRequest{}); err != nil {
		t.Fatalf("CRI ListImages after bad input: %v", err)
	}
	if strings.Contains(e.d.Log(), "gRPC handler panicked") {
		t.Fatal("a handler panicked; the recovery interceptor caught it (see the daemon log)")
	}
}

func quoteShort(s string) string {
	if len(s) > 20 {
		return "(" + s[:20] + "…)"
	}
	return "(" + s + ")"
}
