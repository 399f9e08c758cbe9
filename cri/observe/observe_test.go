package observe

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCountsCRIRequestsOnly(t *testing.T) {
	reg := prometheus.NewRegistry()
	i, err := New(reg)
	if err != nil {
		t.Fatal(err)
	}
	unary := i.UnaryServerInterceptor()
	stream := i.StreamServerInterceptor()
	call := func(method string, err error) {
		_, _ = unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: method},
			func(context.Context, any) (any, error) { return nil, err })
	}
	call("/runtime.v1.ImageService/PullImage", nil)
	call("/runtime.v1.ImageService/PullImage", status.Error(codes.NotFound, "x"))
	call("/containerd.services.images.v1.Images/List", nil)
	_ = stream(nil, nil, &grpc.StreamServerInfo{FullMethod: "/runtime.v1.RuntimeService/GetContainerEvents"},
		func(any, grpc.ServerStream) error { return errors.New("boom") })

	for _, tc := range []struct {
		method, code string
		want         float64
	}{
		{"/runtime.v1.ImageService/PullImage", "OK", 1},
		{"/runtime.v1.ImageService/PullImage", "NotFound", 1},
		{"/runtime.v1.RuntimeService/GetContainerEvents", "Unknown", 1},
		{"/containerd.services.images.v1.Images/List", "OK", 0},
	} {
		if got := testutil.ToFloat64(i.requests.WithLabelValues(tc.method, tc.code)); got != tc.want {
			t.Errorf("%s %s: %v, want %v", tc.method, tc.code, got, tc.want)
		}
	}
}

func TestRegisterTwiceFails(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := New(reg); err == nil {
		t.Fatal("second registration on one registry succeeded")
	}
}
