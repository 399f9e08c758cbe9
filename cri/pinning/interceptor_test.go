package pinning

import (
	"context"
	"strings"
	"testing"

	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/pullwise/pullwise/cri/criconfig"
)

// criImages answers ImageStatus from a fixed table, as CRI would after
// resolving any of an image's names.
type criImages struct {
	byRef map[string]*runtime.Image
	err   error
}

func (c *criImages) ImageStatus(_ context.Context, r *runtime.ImageStatusRequest) (*runtime.ImageStatusResponse, error) {
	if c.err != nil {
		return nil, c.err
	}
	return &runtime.ImageStatusResponse{Image: c.byRef[r.GetImage().GetImage()]}, nil
}

func TestRemovalInterceptor(t *testing.T) {
	s := newTestStore(t)
	for _, r := range []record{
		{name: pause310, target: pauseManifest, labels: pinnedByConfig},
		{name: pauseDigestRef, target: pauseManifest, labels: pinnedByConfig},
		{name: pauseID, target: pauseManifest, labels: pinnedByConfig},
		{name: app, target: appManifest},
		{ns: "default", name: pause310, target: pauseManifest},
	} {
		s.create(t, r)
	}
	pins, err := NewPins(map[string]string{"sandbox": pause310})
	if err != nil {
		t.Fatal(err)
	}
	pause := &runtime.Image{Id: pauseID, RepoTags: []string{pause310}, RepoDigests: []string{pauseDigestRef}, Pinned: true}
	cri := &criImages{byRef: map[string]*runtime.Image{
		pause310: pause, "pause:3.10-short": pause, pauseID: pause, pauseID[:19]: pause,
		app: {Id: "sha256:app", RepoTags: []string{app}},
	}}
	intercept := NewRemovalInterceptor(NewGuard(s, pins), cri).UnaryServerInterceptor()

	removeImage := func(ref string) any {
		return &runtime.RemoveImageRequest{Image: &runtime.ImageSpec{Image: ref}}
	}
	k8s := namespaces.WithNamespace(context.Background(), criconfig.Namespace)
	other := namespaces.WithNamespace(context.Background(), "default")
	for _, tc := range []struct {
		name     string
		ctx      context.Context
		req      any
		criErr   error
		wantCode codes.Code // codes.OK: passed to the handler
		wantMsg  string
	}{
		{name: "CRI remove by tag", ctx: context.Background(), req: removeImage(pause310), wantCode: codes.FailedPrecondition, wantMsg: "pinned_images.sandbox"},
		{name: "CRI remove by short name", ctx: context.Background(), req: removeImage("pause:3.10-short"), wantCode: codes.FailedPrecondition},
		{name: "CRI remove by ID", ctx: context.Background(), req: removeImage(pauseID), wantCode: codes.FailedPrecondition},
		{name: "CRI remove by truncated ID", ctx: context.Background(), req: removeImage(pauseID[:19]), wantCode: codes.FailedPrecondition},
		{name: "CRI remove of an unpinned image", ctx: context.Background(), req: removeImage(app)},
		{name: "CRI remove of a missing image", ctx: context.Background(), req: removeImage("registry.example.com/missing:1")},
		{
			name: "CRI cannot resolve", ctx: context.Background(), req: removeImage(app), criErr: status.Error(codes.Unavailable, "cri down"),
			wantCode: codes.Unavailable, wantMsg: `resolve image "` + app + `" to check whether it is pinned`,
		},
		{name: "ctr rm in k8s.io", ctx: k8s, req: &imagesapi.DeleteImageRequest{Name: pauseDigestRef}, wantCode: codes.FailedPrecondition, wantMsg: pauseDigestRef},
		{name: "ctr rm of an unpinned image", ctx: k8s, req: &imagesapi.DeleteImageRequest{Name: app}},
		{name: "ctr rm in another namespace", ctx: other, req: &imagesapi.DeleteImageRequest{Name: pause310}},
		{name: "delete without a namespace", ctx: context.Background(), req: &imagesapi.DeleteImageRequest{Name: pause310}},
		{name: "other request", ctx: k8s, req: &runtime.ImageStatusRequest{Image: &runtime.ImageSpec{Image: pause310}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cri.err = tc.criErr
			handled := false
			resp, err := intercept(tc.ctx, tc.req, &grpc.UnaryServerInfo{FullMethod: "/test"},
				func(context.Context, any) (any, error) { handled = true; return "handled", nil })
			if tc.wantCode == codes.OK {
				if err != nil || !handled || resp != "handled" {
					t.Fatalf("not passed on: resp %v, err %v", resp, err)
				}
				return
			}
			if handled {
				t.Fatal("refused request reached the handler")
			}
			st, _ := status.FromError(err)
			if st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("got %v %q, want %v with %q", st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
			}
		})
	}
}
