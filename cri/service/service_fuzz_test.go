package service

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"

	api "github.com/pullwise/pullwise/cri/api/v1alpha1"
	"github.com/pullwise/pullwise/cri/policy"
	"github.com/pullwise/pullwise/cri/pullsource"
	"github.com/pullwise/pullwise/transfer"
	"github.com/pullwise/pullwise/transfer/health"
	"github.com/pullwise/pullwise/transfer/hub"
)

// emptyCRI is a CRI with no images, pods or containers, answering as
// upstream does: status requests with an empty response or NotFound.
type emptyCRI struct {
	runtime.UnimplementedRuntimeServiceServer
	runtime.UnimplementedImageServiceServer
}

func (emptyCRI) ImageStatus(context.Context, *runtime.ImageStatusRequest) (*runtime.ImageStatusResponse, error) {
	return &runtime.ImageStatusResponse{}, nil
}
func (emptyCRI) PullImage(_ context.Context, r *runtime.PullImageRequest) (*runtime.PullImageResponse, error) {
	return nil, status.Errorf(codes.NotFound, "%s: not found", r.GetImage().GetImage())
}
func (emptyCRI) ListImages(context.Context, *runtime.ListImagesRequest) (*runtime.ListImagesResponse, error) {
	return &runtime.ListImagesResponse{}, nil
}
func (emptyCRI) ContainerStatus(_ context.Context, r *runtime.ContainerStatusRequest) (*runtime.ContainerStatusResponse, error) {
	return nil, status.Errorf(codes.NotFound, "container %q: not found", r.GetContainerId())
}
func (emptyCRI) ListContainers(context.Context, *runtime.ListContainersRequest) (*runtime.ListContainersResponse, error) {
	return &runtime.ListContainersResponse{}, nil
}
func (emptyCRI) PodSandboxStatus(_ context.Context, r *runtime.PodSandboxStatusRequest) (*runtime.PodSandboxStatusResponse, error) {
	return nil, status.Errorf(codes.NotFound, "pod %q: not found", r.GetPodSandboxId())
}

// emptyStore is an image store with no records.
type emptyStore struct{}

func (emptyStore) Get(_ context.Context, name string) (images.Image, error) {
	return images.Image{}, fmt.Errorf("image %q: %w", name, errdefs.ErrNotFound)
}
func (emptyStore) List(context.Context, ...string) ([]images.Image, error) { return nil, nil }
func (emptyStore) Create(context.Context, images.Image) (images.Image, error) {
	return images.Image{}, errdefs.ErrNotImplemented
}
func (emptyStore) Update(context.Context, images.Image, ...string) (images.Image, error) {
	return images.Image{}, errdefs.ErrNotImplemented
}
func (emptyStore) Delete(context.Context, string, ...images.DeleteOpt) error {
	return errdefs.ErrNotImplemented
}

type urlIssuer struct{}

func (urlIssuer) Issue(hub.Selector) (string, error) { return "http://127.0.0.1:1/progress/t", nil }

// rawCodec sends the fuzzer's bytes as they are: the server decodes them
// itself, as it would any client's.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// newFuzzService serves the Pullwise service on an in-memory listener with
// fakes behind it, and a recovery interceptor that counts panics: a panic
// reaching it is a failure, the interceptor being a last resort only.
func newFuzzService(f *testing.F) (*grpc.ClientConn, *atomic.Int64) {
	panics := &atomic.Int64{}
	recovering := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				panics.Add(1)
				err = status.Errorf(codes.Internal, "panic: %v", p)
			}
		}()
		return h(ctx, req)
	}
	store := emptyStore{}
	sources := pullsource.New(store, nil)
	decider := policy.New(policy.Deps{
		Local: policy.CRILocal(func() (policy.ImageStatuser, error) { return emptyCRI{}, nil }, store),
		Resolve: func(context.Context, string, *runtime.AuthConfig) (digest.Digest, string, time.Duration, error) {
			return "", "", 0, fmt.Errorf("resolve: %w", errdefs.ErrNotFound)
		},
		Reassert: func(context.Context, string, string, string) {},
	}, policy.DefaultRetry)
	svc := New(Runtime{
		PullwiseVersion: "test", Name: "containerd", Version: "v2",
		PullPath:   func() (bool, string) { return true, "" },
		Pulls:      func() []transfer.PullStatus { return nil },
		Registries: func() []health.Status { return nil },
		CRI:        func() (CRI, error) { return emptyCRI{}, nil },
		Sources:    sources,
		Decider:    decider,
		Progress:   urlIssuer{},
	})
	l := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.UnaryInterceptor(recovering))
	if err := svc.Register(gs); err != nil {
		f.Fatal(err)
	}
	go gs.Serve(l)
	f.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close() })
	return conn, panics
}

// decodes reports whether data is a valid request message for method m.
// grpc answers bytes that do not decode itself, before any handler runs.
func decodes(m grpc.MethodDesc, data []byte) bool {
	var decErr error
	dec := func(v any) error {
		decErr = proto.Unmarshal(data, v.(proto.Message))
		if decErr == nil {
			decErr = errStop
		}
		return decErr
	}
	m.Handler(nil, context.Background(), dec, nil)
	return decErr == errStop
}

var errStop = fmt.Errorf("decoded")

// FuzzPullwiseRPC sends random bytes as the request of each Pullwise RPC
// through the gRPC server. Nothing may panic, and no answer to a request
// that decodes may be Internal or Unknown: bad input is InvalidArgument or
// NotFound (or another code that says what is wrong), with a message.
func FuzzPullwiseRPC(f *testing.F) {
	conn, panics := newFuzzService(f)
	methods := api.Pullwise_ServiceDesc.Methods
	seed := func(i int, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	for i, m := range methods {
		f.Add(uint8(i), []byte{})
		f.Add(uint8(i), []byte{0xff, 0xff})
		switch m.MethodName {
		case "PullImage":
			for _, img := range []string{"", "busybox", "UPPER/case", "a@sha256:zz", "::", "a\x01b", strings.Repeat("a", 1<<16)} {
				seed(i, &api.PullImageRequest{Image: &runtime.ImageSpec{Image: img}})
			}
			for _, p := range []int32{1, 2, 3, 4, 99, -1} {
				seed(i, &api.PullImageRequest{Image: &runtime.ImageSpec{Image: "busybox"}, PullPolicy: api.PullPolicy(p)})
			}
			seed(i, &api.PullImageRequest{Image: &runtime.ImageSpec{Image: "busybox", Annotations: map[string]string{policy.Annotation: "\x00"}}})
		case "ImageStatus":
			for _, img := range []string{"", "busybox", "sha256:zz", "::"} {
				seed(i, &api.ImageStatusRequest{Image: &runtime.ImageSpec{Image: img}, Verbose: true})
			}
		case "ContainerStatus":
			seed(i, &api.ContainerStatusRequest{ContainerId: "nope", Verbose: true})
		case "ImagePullProgress":
			seed(i, &api.ImagePullProgressRequest{Image: "UPPER/case"})
			seed(i, &api.ImagePullProgressRequest{PodSandboxId: "nope"})
			seed(i, &api.ImagePullProgressRequest{ContainerId: "nope", PodSandboxId: "other"})
			seed(i, &api.ImagePullProgressRequest{Image: "busybox"})
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		m := methods[int(which)%len(methods)]
		method := "/" + api.Pullwise_ServiceDesc.ServiceName + "/" + m.MethodName
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var out []byte
		before := panics.Load()
		err := conn.Invoke(ctx, method, &data, &out, grpc.ForceCodec(rawCodec{}))
		if panics.Load() != before {
			t.Fatalf("%s panicked on %x: %v", m.MethodName, data, err)
		}
		if !decodes(m, data) {
			// grpc itself answers Internal for a message that is not one;
			// no handler saw it.
			if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "unmarshal") {
				t.Fatalf("%s on undecodable %x: %v", m.MethodName, data, err)
			}
			return
		}
		st, _ := status.FromError(err)
		switch st.Code() {
		case codes.OK:
		case codes.Internal, codes.Unknown, codes.DeadlineExceeded:
			t.Fatalf("%s on %x: %v", m.MethodName, data, err)
		default:
			if st.Message() == "" {
				t.Fatalf("%s on %x: %s without a message", m.MethodName, data, st.Code())
			}
		}
	})
}
